"""Free local ports for the services a job or a test starts.

A port the kernel hands out for `bind(0)` lies in its ephemeral range, the range it also uses
for every outgoing socket: between picking one and binding it (vLLM starts in between, 30 s on
a CPU, opening sockets of its own) another process can be given the same port. So the pick is
below that range, where the kernel hands nothing out by itself.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20000
"""Below the usual dynamic ranges (Linux 32768-60999, IANA 49152-65535) and above most
well-known services' ports."""
TRIES = 64
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, outside the ephemeral range where there is room below it."""
    low = ephemeral_low()
    if low - LOWEST >= TRIES:
        for port in random.SystemRandom().sample(range(LOWEST, low), TRIES):  # not the seeded global RNG
            if bindable(host, port):
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; IANA's 49152 elsewhere)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
