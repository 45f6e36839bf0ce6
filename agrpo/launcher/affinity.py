"""CPU placement of processes already running: benchmarks on few cores pin a process's
threads after it has started (its children were spawned on the cores it started on)."""

from __future__ import annotations

import os
from pathlib import Path


def cores(text: str) -> set[int]:
    """Core numbers from taskset's list form ("0", "1,2" or "0-3")."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def pin_threads(pid: int, cpus: str) -> None:
    """Move every thread of process `pid` (not its children) to `cpus`; threads it starts
    later inherit their creator's cores."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cores(cpus))
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
