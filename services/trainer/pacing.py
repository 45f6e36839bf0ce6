"""How much generation the trainer lets rollout have in flight: the pacing rule.

A credit is room for one sample between its dispatch to vLLM and its training. Rollout
holds G credits before it dispatches a group, so everything it generates can still be
trained within `max_staleness` of the version it is generated under:

    window   = (max_staleness + 1) x per_version        (sync schedule: 1 x per_version)
    occupied = credits outstanding (at producers) + buffered + consumed at this version
    room     = min(window, queue_maxsize) - occupied     -> granted as credits

`consumed` counts samples taken from the buffer since the trainer's version last moved
(in open micro-batches or trained). It resets when the version moves (to the samples
already placed in the next step), which with an overlapped push is before the weights are
in vLLM; room opens only once they are (`version_live`), so a group dispatched with a
fresh credit always starts at the newest weights. A sample that leaves without training (dropped, duplicate) frees its
room at once. `per_version` is samples trained per version: the smallest of the last
few versions (an overestimate would let samples go stale), and no more than nominal
(batch x ranks x grad-accum x weight_sync_steps) until those few are measured. Under a token budget a
step's size moves by whole groups as completions change length, so the sizes measured may be
the largest the run will see: on several rows (trainer ranks) the rows' packing moved a step by
a group (32 and 40 samples on two ranks), so there the estimate is one group less for each row
past the first. Pure bookkeeping.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class Pace:
    """The window of samples rollout may have between dispatch and training."""

    max_staleness: int
    nominal_per_version: int
    capacity: int
    group_size: int = 1
    sync: bool = False
    """Sync schedule: one version's batch at a time (generate, train, sync, repeat)."""
    fixed_window: int | None = None
    """trainer.credit_window: a window set by hand instead of the rule."""
    rows: int = 1
    """Rows a micro-batch packs (the trainer's ranks)."""
    consumed: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=5))
    holding: bool = False
    """The trainer's version moved and its weights are on their way to vLLM: no room until
    they are live (work dispatched now would start at the old weights)."""

    @property
    def per_version(self) -> int:
        if self.sync or not self.recent:
            return self.nominal_per_version
        if len(self.recent) < (self.recent.maxlen or 0):  # too few versions to know the smallest
            return max(1, min(*self.recent, self.nominal_per_version))
        return max(1, min(self.recent) - (self.rows - 1) * self.group_size)

    @property
    def window(self) -> int:
        """Samples allowed between dispatch and training; whole groups only."""
        if self.fixed_window:
            return min(self.fixed_window, self.capacity)
        lead = 0 if self.sync else self.max_staleness
        raw = (lead + 1) * self.per_version
        if self.sync:  # the step trains exactly what was generated: round up to whole groups
            raw = -(-raw // self.group_size) * self.group_size
        else:          # never past max_staleness: round down (but let one group through)
            raw = max(self.group_size, raw // self.group_size * self.group_size)
        return min(raw, self.capacity)

    def room(self, buffered: int, outstanding: int) -> int:
        """Credits that may be granted now."""
        if self.holding:
            return 0
        return max(0, self.window - self.consumed - buffered - outstanding)

    def consume(self, n: int = 1) -> None:
        """n samples left the buffer for a micro-batch."""
        self.consumed += n

    def release(self, n: int) -> None:
        """n consumed samples left untrained (evicted as stale, refused): their room is free."""
        self.consumed = max(0, self.consumed - n)

    def published(self, trained: int, carried: int) -> None:
        """A version was published after training `trained` samples at the last one;
        `carried` samples already sit in the next step's open micro-batch."""
        self.version_moved(trained, carried)
        self.version_live()

    def version_moved(self, trained: int, carried: int) -> None:
        """The trainer's version moved (its weights were snapshotted for a push): what it
        consumes from now on counts against the new version. Room waits for version_live."""
        if trained > 0:
            self.recent.append(trained)
        self.consumed = carried
        self.holding = True

    def version_live(self) -> None:
        """The new version is in vLLM: its generation's room opens."""
        self.holding = False

    def step_complete(self) -> bool:
        """Sync schedule: the step has everything that was generated for it."""
        return self.sync and self.consumed >= self.window
