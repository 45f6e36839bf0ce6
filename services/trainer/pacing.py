"""How much generation the trainer lets rollout have in flight: the pacing rule.

A credit is room for one sample between its dispatch to vLLM and its training. Rollout
holds G credits before it dispatches a group, so everything it generates can still be
trained within `max_staleness` of the version it is generated under:

    window   = (max_staleness + 1) x per_version        (sync schedule: 1 x per_version)
    occupied = credits outstanding (at producers) + buffered + consumed at this version
    room     = min(window, queue_maxsize) - occupied     -> granted as credits

`per_version` is what one version trains: the samples of a step (per_device_train_batch_size x
gradient_accumulation_steps x ranks, whole groups: every step trains exactly that many, whatever
the token budget) x weight_sync_steps. `consumed` counts samples taken from the buffer since the
trainer's version last moved (in the step being gathered or trained). It resets when the version
moves, which with an overlapped push is before the weights are in vLLM; room opens only once they
are (`version_live`), so a group dispatched with a fresh credit always starts at the newest
weights. A sample that leaves without training (dropped, duplicate) frees its room at once.
Pure bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Pace:
    """The window of samples rollout may have between dispatch and training."""

    max_staleness: int
    per_step: int
    """Samples an optimizer step trains (AgrpoConfig.samples_per_step: whole groups)."""
    capacity: int
    group_size: int = 1
    steps_per_version: int = 1
    """weight_sync_steps: optimizer steps between published versions."""
    sync: bool = False
    """Sync schedule: one version's batch at a time (generate, train, sync, repeat)."""
    fixed_window: int | None = None
    """trainer.credit_window: a window set by hand instead of the rule."""
    consumed: int = 0
    holding: bool = False
    """The trainer's version moved and its weights are on their way to vLLM: no room until
    they are live (work dispatched now would start at the old weights)."""

    @property
    def per_version(self) -> int:
        return self.per_step * self.steps_per_version

    @property
    def window(self) -> int:
        """Samples allowed between dispatch and training; whole groups only."""
        if self.fixed_window:
            return min(self.fixed_window, self.capacity)
        lead = 0 if self.sync else self.max_staleness
        raw = (lead + 1) * self.per_version  # whole groups: a step is whole groups
        return min(raw, max(self.group_size, self.capacity // self.group_size * self.group_size))

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

    def published(self, carried: int = 0) -> None:
        """A version was published; `carried` samples already count against the next one."""
        self.version_moved(carried)
        self.version_live()

    def version_moved(self, carried: int = 0) -> None:
        """The trainer's version moved (its weights were snapshotted for a push): what it
        consumes from now on counts against the new version. Room waits for version_live."""
        self.consumed = carried
        self.holding = True

    def version_live(self) -> None:
        """The new version is in vLLM: its generation's room opens."""
        self.holding = False
