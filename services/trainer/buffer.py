"""The bounded sample buffer between PushSamples and the training loop, in whole groups.

A group is trained whole or not at all: its rows are held here until all `group_size` of
them have arrived (a row refused at intake as malformed no longer counts as expected), and
only then can the loop take it. A group whose producer's stream ends before it is complete
is discarded without an answer: a producer that reconnects sends its unfinished groups again
whole, and the prompts of one that died are re-issued from the trainer's resume point. A
group with a row off the trainer's lineage is doomed whole (its other rows are refused too),
so its prompt is re-issued. A sample without a group size is a group by itself.

Holds at most `capacity` samples, gathering ones included (the intake grants credits
against that). Complete groups leave oldest policy version first (their oldest row's), in
arrival order within a version: a group that finished late is the one closest to the
staleness bound, so it trains first (TRL's queue is plain FIFO). Staleness is judged at
consumption (`pop_fresh`), against the trainer's version at that moment, as TRL does.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from .sample import Sample

Group = list[Sample]
DOOMED_REMEMBERED = 4096
"""Doomed group ids kept to refuse their late rows (a group's rows arrive within moments)."""


@dataclass
class _Gathering:
    """A group's rows so far, and those refused (which it no longer waits for)."""

    size: int
    producer_id: str
    samples: Group = field(default_factory=list)
    refused: set[str] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return len(self.samples) + len(self.refused) >= self.size


class SampleBuffer:
    """Complete groups by (oldest policy version, arrival), with an event for waiters (event-loop only)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._queue: list[tuple[int, int, Group]] = []
        self._gathering: dict[str, _Gathering] = {}
        self._doomed: OrderedDict[str, None] = OrderedDict()
        self._count = 0
        self._arrival = itertools.count()
        self._nonempty = asyncio.Event()

    def __len__(self) -> int:
        """Samples held, complete groups and gathering ones."""
        return self._count

    @property
    def free(self) -> int:
        return self.capacity - self._count

    @property
    def gathering(self) -> int:
        """Samples of groups still waiting for rows."""
        return sum(len(g.samples) for g in self._gathering.values())

    def put(self, sample: Sample) -> bool:
        """Hold one row; the group becomes available once complete. False (nothing held) when
        its group was doomed. The caller checked duplicates and credit (so there is room)."""
        if self._count >= self.capacity:
            raise OverflowError("sample buffer full: producer sent without credit")
        if sample.group_id in self._doomed:
            return False
        self._count += 1
        if sample.group_size <= 1:
            self._release([sample])
            return True
        self._gathering_of(sample).samples.append(sample)
        self._maybe_release(sample.group_id)
        return True

    def expect_fewer(self, sample: Sample) -> None:
        """A row of this sample's group was refused as malformed: the group no longer waits for it."""
        if sample.group_size <= 1 or sample.group_id in self._doomed:
            return
        self._gathering_of(sample).refused.add(sample.sample_id)
        self._maybe_release(sample.group_id)

    def _gathering_of(self, sample: Sample) -> _Gathering:
        return self._gathering.setdefault(sample.group_id, _Gathering(sample.group_size, sample.producer_id))

    def doom(self, group_id: str) -> Group:
        """The group cannot be trained whole: forget its rows (returned) and refuse later ones."""
        self._doomed[group_id] = None
        while len(self._doomed) > DOOMED_REMEMBERED:
            self._doomed.popitem(last=False)
        return self._forget(group_id)

    def discard_incomplete(self, producer_id: str) -> Group:
        """The producer's stream ended: forget its incomplete groups (returned)."""
        ids = [gid for gid, g in self._gathering.items() if g.producer_id == producer_id]
        return [s for gid in ids for s in self._forget(gid)]

    def evict_incomplete(self, is_stale: Callable[[Group], bool]) -> Group:
        """Forget incomplete groups that became stale while waiting (returned), and groups that
        hold only refused rows."""
        ids = [gid for gid, g in self._gathering.items() if not g.samples or is_stale(g.samples)]
        return [s for gid in ids for s in self._forget(gid)]

    def _forget(self, group_id: str) -> Group:
        gathering = self._gathering.pop(group_id, None)
        if gathering is None:
            return []
        self._count -= len(gathering.samples)
        return gathering.samples

    def _maybe_release(self, group_id: str) -> None:
        gathering = self._gathering[group_id]
        if gathering.complete:
            del self._gathering[group_id]
            if gathering.refused:  # the group trains without them: say so in the audit
                for sample in gathering.samples:
                    sample.group_size = len(gathering.samples)
            if gathering.samples:
                self._release(gathering.samples)

    def _release(self, group: Group) -> None:
        oldest = min(s.policy_version for s in group)
        heapq.heappush(self._queue, (oldest, next(self._arrival), group))
        self._nonempty.set()

    def pop(self) -> Group | None:
        """The next complete group, or None."""
        if not self._queue:
            self._nonempty.clear()  # after a wake() with nothing complete
            return None
        _, _, group = heapq.heappop(self._queue)
        self._count -= len(group)
        if not self._queue:
            self._nonempty.clear()
        return group

    def pop_fresh(self, is_stale: Callable[[Group], bool]) -> tuple[Group | None, Group]:
        """Next complete group that is not stale (or None), and the rows of the stale groups
        skipped on the way."""
        stale: Group = []
        while (group := self.pop()) is not None:
            if not is_stale(group):
                return group, stale
            stale += group
        return None, stale

    def wake(self) -> None:
        """Release a waiter at once (the loop is stopping)."""
        self._nonempty.set()

    async def wait_nonempty(self, timeout: float | None) -> bool:
        """Wait until a complete group is buffered; False on timeout."""
        try:
            await asyncio.wait_for(self._nonempty.wait(), timeout)
            return True
        except TimeoutError:
            return False
