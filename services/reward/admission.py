"""Admission: how many scoring requests the service takes on, decided before any work.

At most `capacity` requests (`num_workers + max_queue`) are admitted at once. A unary
request is admitted or refused at once, before its bytes are even parsed, so refusing
costs next to nothing under overload. It is also refused when, at the current pace, it
would not be done before its deadline: work that the caller will have given up on
is work taken from requests that can still make it.

    expected_s = (admitted + 1) * pace_s,   pace_s = EWMA(worker-seconds per request) / num_workers
    refuse when admitted >= capacity, or expected_s > DEADLINE_SHARE * time_left_s

Stream requests wait for a slot instead (in arrival order), so a stream that sends
faster than the service scores is slowed down by HTTP/2 flow control, not refused.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Iterator

from agrpo.services.common.errors import ResourceExhausted

DEADLINE_SHARE = 0.8
"""Part of a caller's remaining time that its request may expect to take, queue included."""

EWMA_ALPHA = 0.1
"""Weight of the latest request in the pace estimate."""


class Admission:
    """Slots for scoring requests: `admit` (refused when full) or `wait_for_slot`."""

    def __init__(self, capacity: int, num_workers: int,
                 on_change: Callable[[int], None] = lambda admitted: None) -> None:
        self.capacity, self._num_workers, self._on_change = capacity, num_workers, on_change
        self.admitted = 0
        self.pace_s = 0.0
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    @contextlib.contextmanager
    def admit(self, time_left_s: float | None) -> Iterator[None]:
        """Hold a slot for one request, or raise ResourceExhausted (see the module doc)."""
        if self.admitted >= self.capacity or self._waiters:
            raise ResourceExhausted(f"reward service is at capacity ({self.capacity} requests "
                                    "admitted); retry with backoff")
        expected = (self.admitted + 1) * self.pace_s
        if time_left_s is not None and expected > DEADLINE_SHARE * time_left_s:
            raise ResourceExhausted(f"reward service is overloaded: a request admitted now would "
                                    f"take about {expected:.1f}s, the deadline is in "
                                    f"{time_left_s:.1f}s; retry with backoff")
        self._take()
        try:
            yield
        finally:
            self.release()

    async def wait_for_slot(self) -> None:
        """Take a slot, waiting (in arrival order) while all are held; `release` it after."""
        if self.admitted < self.capacity and not self._waiters:
            self._take()
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        try:
            await turn  # release() hands its slot over
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed over as we were cancelled: pass it on
            elif turn in self._waiters:
                self._waiters.remove(turn)
            raise

    def release(self) -> None:
        """Give a slot back: to the first waiter if there is one."""
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)  # the slot changes hands: `admitted` stays
                return
        self.admitted -= 1
        self._on_change(self.admitted)

    def observe(self, worker_s: float) -> None:
        """One request done: it kept workers busy for `worker_s` seconds in all."""
        sample = worker_s / self._num_workers
        self.pace_s = sample if self.pace_s == 0.0 else (
            (1 - EWMA_ALPHA) * self.pace_s + EWMA_ALPHA * sample)

    def _take(self) -> None:
        self.admitted += 1
        self._on_change(self.admitted)
