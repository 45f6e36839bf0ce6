"""Keep a job's service processes running: restart a crashed one with back-off, give up on repeats.

A service that exits 0 is done (rollout and the trainer exit 0 once training is done under
`agrpo run`); one that exits 2 found a configuration that cannot work (its one-line error
ends the job: a restart would repeat it). One that exits otherwise is restarted after a back-off that doubles per
crash; the services resume by themselves (the trainer from its latest checkpoint of this
run, rollout from the trainer's resume point). More than `max_restarts` crashes within
`window_s` stop the job with the service's last log lines.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from agrpo.services.common.preflight import STARTUP_ERROR_EXIT, StartupError
from agrpo.services.common.timeouts import RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S, RESTART_WINDOW_S

from .processes import ServiceProcess


@dataclass(frozen=True)
class RestartPolicy:
    """How many crashes to absorb, and how long to wait before each restart."""

    max_restarts: int = 3
    window_s: float = RESTART_WINDOW_S
    backoff_s: float = RESTART_BACKOFF_S
    backoff_max_s: float = RESTART_BACKOFF_MAX_S

    def delay(self, crashes: int) -> float:
        return min(self.backoff_s * 2 ** max(crashes - 1, 0), self.backoff_max_s)


@dataclass
class Supervised:
    """One service: its process, its crashes, and when it may start again."""

    process: ServiceProcess
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    say: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    crashes: deque = field(default_factory=deque)
    restart_at: float | None = None
    restarts: int = 0
    done: bool = False

    @property
    def name(self) -> str:
        return self.process.name

    def start(self) -> None:
        self.process.start()

    def check(self) -> str | None:
        """Restart what crashed (when its back-off is over); a fatal error message, or None."""
        if self.done:
            return None
        if self.restart_at is not None:
            if self.clock() >= self.restart_at:
                self.restart_at = None
                self.restarts += 1
                self.process.start()
            return None
        if self.process.alive():
            return None
        assert self.process.proc is not None  # checked only once started: not alive() means it exited
        code = self.process.proc.returncode
        if code == 0:
            self.done = True
            return None
        if code == STARTUP_ERROR_EXIT:  # a configuration that cannot work: restarting repeats it
            self.done = True
            raise StartupError(self.process.log_tail(1).strip() or f"{self.name} exited with code {code}")
        now = self.clock()
        self.crashes.append(now)
        while self.crashes and now - self.crashes[0] > self.policy.window_s:
            self.crashes.popleft()
        if len(self.crashes) > self.policy.max_restarts:
            return (f"{self.name} exited with code {code} {len(self.crashes)} times within "
                    f"{self.policy.window_s:.0f} s; its last lines:\n{self.process.log_tail()}")
        delay = self.policy.delay(len(self.crashes))
        self.say(f"[run] {self.name} exited with code {code}; restarting in {delay:.0f} s "
                 f"(crash {len(self.crashes)} of {self.policy.max_restarts} allowed)")
        self.restart_at = now + delay
        return None
