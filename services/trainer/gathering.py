"""Gathering a step: fresh whole groups from the buffer into micro-batches; the rest dropped and acked.

One optimizer step consumes `gradient_accumulation_steps` micro-batches from the planner; a
micro-batch also closes when no sample arrived for `trainer.idle_flush_s` (the tail of an
epoch, or a slow producer), and a step may then have fewer micro-batches (the loss is averaged
over those it has). Under the sync schedule a step is exactly what was generated for it
(pacing.py). A group goes whole into one step: stale by its stalest row, claimed for its prompt
key by the ledger (a re-issued prompt whose first group is trained is refused), placed whole.
When the version moves, open groups that became stale and incomplete groups that waited too
long are dropped, so nothing trains past max_staleness.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.logging import get_logger
from agrpo.services.common.metrics import IdleClock

from .buffer import SampleBuffer
from .intake import OTHER_GROUP, Intake
from .metrics import TrainerMetrics
from .packing import FixedCountBatcher, MicroBatch, TokenBudgetBatcher, make_batcher
from .sample import Outcome, Sample
from .state import TrainState

log = get_logger("trainer.gathering")


@dataclass
class StepInput:
    """What one step gathered."""

    batches: list[MicroBatch]
    wait_s: float = 0.0
    stale: list[Sample] = field(default_factory=list)
    trained_version: int = 0  # the trainer's version when the step trained (before publishing)
    staleness: list[int] = field(default_factory=list)  # per trained sample, positions on the lineage

    @property
    def samples(self) -> list[Sample]:
        return [s for mb in self.batches for s in mb.samples]


class StepGatherer:
    """Pulls steps out of the buffer (event-loop only)."""

    def __init__(self, cfg: AgrpoConfig, state: TrainState, buffer: SampleBuffer, intake: Intake,
                 metrics: TrainerMetrics, num_rows: int, idle: IdleClock,
                 max_model_len: Callable[[], int | None], reconcile: Callable[[], Awaitable[None]]) -> None:
        self.cfg, self.state, self.buffer, self.intake, self.metrics = cfg, state, buffer, intake, metrics
        self.ledger, self.pace = state.ledger, intake.pace
        self.num_rows, self.idle = num_rows, idle
        self.max_model_len, self.reconcile = max_model_len, reconcile
        self.batcher: TokenBudgetBatcher | FixedCountBatcher | None = None  # start() builds it
        self.drops: Counter = Counter()  # samples not trained, by reason (stale, oversize, duplicate_prompt)

    def token_budget(self) -> int | None:
        """The batcher's budget in force (None until the servers' max_model_len is known)."""
        budget = self.cfg.token_budget
        if budget is None:
            return self.max_model_len()
        return budget if budget > 0 else None

    @property
    def _batcher(self) -> TokenBudgetBatcher | FixedCountBatcher:
        assert self.batcher is not None  # the loop calls start() before it pulls steps
        return self.batcher

    def start(self) -> None:
        """The planner, once the servers' max_model_len is known: one row per rank in every
        micro-batch (TRL's num_processes), rank r trains row r."""
        self.batcher = make_batcher(self.cfg.token_budget, self.max_model_len() or 0, self.num_rows,
                                    self.cfg.per_device_train_batch_size, self._on_oversize,
                                    self.cfg.trainer.max_samples_per_micro_batch)

    async def pull(self, stop: asyncio.Event) -> StepInput | None:
        """Gather one step of fresh samples: GA micro-batches (async), or everything that was
        generated for the step (sync). None once `stop` is set."""
        out = StepInput([])
        last_check = time.monotonic()
        while not self._step_full(out):
            if stop.is_set():
                return None
            if self._take_group(out):
                continue
            t = time.monotonic()
            open_samples = self._batcher.num_samples
            timeout = self.cfg.trainer.idle_flush_s if (open_samples or out.batches) else 1.0
            self.idle.busy(False)
            got = await self.buffer.wait_nonempty(timeout)
            self.idle.busy(True)
            out.wait_s += time.monotonic() - t
            if got:
                continue
            if open_samples or out.batches:
                self._flush_into(out)
                if out.batches:
                    return out
            if time.monotonic() - last_check > self.cfg.trainer.reconcile_interval_s:
                await self.reconcile()
                last_check = time.monotonic()
        if self.pace.sync or self._splits_a_group(out):
            # Sync: the step trains exactly the samples generated for it. Async: a group larger
            # than a micro-batch left its tail open; it trains in this step too.
            self._flush_into(out)
        return out

    def version_moved(self, trained: int) -> None:
        """The trainer's version moved after `trained` samples: samples waiting in open rows were
        fresh when popped, but the new version can make them stale before their micro-batch
        closes (a group leaves whole: none of an open group was trained), and incomplete groups
        may have waited past the bound. Consumption now counts against the new version."""
        late_groups = {s.group_id for s in self._batcher.open_samples if self.is_stale(s)}
        late = self._batcher.evict(lambda s: s.group_id in late_groups)
        if late:
            self.ledger.release(late)
            self._drop_stale(late)
        waited_out = self.buffer.evict_incomplete(self.is_group_stale)
        if waited_out:
            self._drop_stale(waited_out)
        self.intake.version_moved(trained, self._batcher.num_samples)

    def is_stale(self, sample: Sample) -> bool:
        """Past max_staleness at the trainer's version, or off its lineage (versions.py)."""
        return self.state.lineage.stale(self.state.version, sample.policy_version, self.cfg.max_staleness)

    def is_group_stale(self, group: list[Sample]) -> bool:
        """A group is as stale as its stalest row: it trains whole or not at all."""
        return any(self.is_stale(s) for s in group)

    def _flush_into(self, out: StepInput) -> None:
        last = self._batcher.flush()
        if last is not None:
            out.batches.append(last)

    def _splits_a_group(self, out: StepInput) -> bool:
        in_step = {s.group_id for s in out.samples}
        return any(s.group_id in in_step for s in self._batcher.open_samples)

    def _step_full(self, out: StepInput) -> bool:
        if self.pace.sync:
            return self.pace.step_complete()
        return len(out.batches) >= self.cfg.gradient_accumulation_steps

    def _take_group(self, out: StepInput) -> bool:
        """Move the next fresh complete group into the micro-batches; False when none is buffered."""
        group, stale = self.buffer.pop_fresh(self.is_group_stale)
        if stale:
            self._drop_stale(stale)
            out.stale += stale
        if group is None:
            return False
        if not self.ledger.claim(group[0]):
            self._drop_other_group(group)
            return True
        self.pace.consume(len(group))
        for sample in group:
            staleness = self.state.staleness(sample.policy_version)
            assert staleness is not None  # a fresh group is on the lineage (is_group_stale)
            self.metrics.staleness.observe(staleness)
        out.batches += self._batcher.add_group(group)
        return True

    def _on_oversize(self, sample: Sample, reason: str) -> None:
        self.pace.release(1)
        self._count_drop("oversize")
        self.intake.settle([sample], Outcome.REJECTED, reason)
        log.warning("dropped sample %s: %s", sample.sample_id, reason)

    def _drop_other_group(self, group: list[Sample]) -> None:
        """A re-issued prompt whose first group is already (being) trained: refuse it."""
        self._count_drop("duplicate_prompt", len(group))
        self.intake.settle(group, Outcome.DUPLICATE, OTHER_GROUP)
        self.intake.regrant()

    def _drop_stale(self, stale: list[Sample]) -> None:
        self._count_drop("stale", len(stale))
        for s in stale:
            distance = self.state.staleness(s.policy_version)
            if distance is not None:
                self.metrics.staleness.observe(distance)
        reason = f"staleness > max_staleness={self.cfg.max_staleness} at version {self.state.version}"
        self.intake.settle(stale, Outcome.DROPPED_STALE, reason)
        self.intake.regrant()

    def _count_drop(self, reason: str, n: int = 1) -> None:
        self.drops[reason] += n
        self.metrics.dropped.labels(reason).inc(n)
