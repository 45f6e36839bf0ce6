"""A supervisor as plain as systemd's `Restart=always` or a compose restart policy: it starts
each service's command line and, when one exits, starts exactly the same command line again,
with the environment it was first given. No run id, no resume flag, nothing added: what a
service does after a crash is what the config the user wrote makes it do.

benchmarks/chaos.py --supervisor plain runs the system under it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path


class PlainSupervisor:
    """Starts commands in their own process groups and restarts any that exits, until stopped."""

    def __init__(self, commands: dict[str, list[str]], env: dict[str, str], logs: Path,
                 restart_delay_s: float = 1.0) -> None:
        self.commands, self.env, self.logs = commands, env, logs
        self.restart_delay_s = restart_delay_s
        self.procs: dict[str, subprocess.Popen] = {}
        self.restarts: Counter = Counter()
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> PlainSupervisor:
        self.logs.mkdir(parents=True, exist_ok=True)
        for name in self.commands:
            self._spawn(name)
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def process(self, name: str) -> subprocess.Popen | None:
        with self._lock:
            return self.procs.get(name)

    def _spawn(self, name: str) -> None:
        with open(self.logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(self.commands[name], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        with self._lock:
            self.procs[name] = proc

    def _watch(self) -> None:
        while not self._stopping.wait(0.2):
            for name in self.commands:
                proc = self.process(name)
                if proc is not None and proc.poll() is not None and not self._stopping.is_set():
                    time.sleep(self.restart_delay_s)
                    if not self._stopping.is_set():
                        self.restarts[name] += 1
                        self._spawn(name)

    def stop(self, order: tuple[str, ...], grace_s: float = 60.0) -> None:
        """SIGTERM in `order` (each waited for up to grace_s), then SIGKILL what is left."""
        self._stopping.set()
        for name in order:
            proc = self.process(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
