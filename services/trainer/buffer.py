"""The bounded sample buffer between PushSamples and the training loop.

Holds at most `capacity` samples (queue_maxsize; the intake knows which ids are
pending, so a re-send is recognised there). Samples leave oldest policy version first,
in arrival order within a version: a group that finished late is the one closest to
the staleness bound, so it trains first (TRL's queue is plain FIFO). Staleness is judged
at consumption (`pop_fresh`), against the trainer's version at that moment, as TRL does.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from .sample import Sample


class SampleBuffer:
    """Samples by (policy version, arrival), with an event for waiters (event-loop only)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._queue: list[tuple[int, int, Sample]] = []
        self._arrival = itertools.count()
        self._nonempty = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def free(self) -> int:
        return self.capacity - len(self._queue)

    def put(self, sample: Sample) -> None:
        """Append; the caller checked duplicates and credit (so there is room)."""
        if len(self._queue) >= self.capacity:
            raise OverflowError("sample buffer full: producer sent without credit")
        heapq.heappush(self._queue, (sample.policy_version, next(self._arrival), sample))
        self._nonempty.set()

    def pop(self) -> Sample | None:
        if not self._queue:
            self._nonempty.clear()  # after a wake() with nothing buffered
            return None
        _, _, sample = heapq.heappop(self._queue)
        if not self._queue:
            self._nonempty.clear()
        return sample

    def pop_fresh(self, is_stale: Callable[[Sample], bool]) -> tuple[Sample | None, list[Sample]]:
        """Next non-stale sample (or None) and the stale ones skipped on the way."""
        stale = []
        while (sample := self.pop()) is not None:
            if not is_stale(sample):
                return sample, stale
            stale.append(sample)
        return None, stale

    def wake(self) -> None:
        """Release a waiter at once (the loop is stopping)."""
        self._nonempty.set()

    async def wait_nonempty(self, timeout: float | None) -> bool:
        """Wait until a sample is buffered; False on timeout."""
        try:
            await asyncio.wait_for(self._nonempty.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
