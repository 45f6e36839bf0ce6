"""Gathering a step: fresh whole groups from the buffer into micro-batches; the rest dropped and acked.

A step trains exactly `samples_per_step` samples (per_device_train_batch_size x
gradient_accumulation_steps x ranks, whole groups: TRL GRPOTrainer's count), under either
schedule. The token budget only cuts them into micro-batches (rows that fit in memory), as many as
it takes; the step's loss is normalised over all of its tokens (engine.py). A step is smaller only
at the run's tail (it holds every prompt the run still has to train) or, when
`trainer.idle_flush_s` is set, after that long without a new sample. A group goes whole into one
step: stale by its stalest row, claimed for its prompt key by the ledger (a re-issued prompt whose
first group is trained is refused), placed whole. When the version moves, incomplete groups that
waited too long are dropped, so nothing trains past max_staleness.
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
                 max_model_len: Callable[[], int | None], reconcile: Callable[[], Awaitable[None]],
                 memory_budget: Callable[[int], tuple[int, int]] | None = None) -> None:
        self.cfg, self.state, self.buffer, self.intake, self.metrics = cfg, state, buffer, intake, metrics
        self.ledger, self.pace = state.ledger, intake.pace
        self.num_rows, self.idle = num_rows, idle
        self.max_model_len, self.reconcile = max_model_len, reconcile
        self.memory_budget = memory_budget  # floor -> (budget, tokens the memory holds): budget.py
        self.batcher: TokenBudgetBatcher | FixedCountBatcher | None = None  # start() builds it
        self.budget: int | None = None  # the row budget in force (start())
        self.drops: Counter = Counter()  # samples not trained, by reason (stale, oversize, duplicate_prompt)

    def token_budget(self) -> int | None:
        """The most tokens a row (and so a sample) may have; None until start() or for a fixed count."""
        return self.budget

    @property
    def _batcher(self) -> TokenBudgetBatcher | FixedCountBatcher:
        assert self.batcher is not None  # the loop calls start() before it pulls steps
        return self.batcher

    def start(self) -> None:
        """The planner, once the servers' max_model_len is known (and everything the trainer holds
        besides its first step is allocated): one row per rank in every micro-batch (TRL's
        num_processes), rank r trains row r; rows within token_budget, or what memory holds."""
        self.budget = self._resolve_budget()
        asked = self.cfg.per_device_train_batch_size * self.cfg.gradient_accumulation_steps * self.num_rows
        if asked != self.pace.per_step:
            log.warning("per_device_train_batch_size x gradient_accumulation_steps x ranks = %d samples is not whole "
                        "groups of num_generations=%d: a step trains %d", asked, self.cfg.num_generations,
                        self.pace.per_step)
        self.batcher = make_batcher(self.budget or 0, self.num_rows, self.cfg.per_device_train_batch_size,
                                    self._on_oversize, self.cfg.trainer.max_samples_per_micro_batch)

    def _resolve_budget(self) -> int | None:
        asked, longest = self.cfg.token_budget, self.max_model_len() or 0
        if asked is not None:
            return asked if asked > 0 else None
        if self.memory_budget is None:
            return longest or None
        budget, fits = self.memory_budget(longest)
        how = (f"what memory holds ({fits} tokens)" if budget == fits else
               f"the longest sample vLLM can return (memory holds {fits} tokens)" if budget == longest else
               f"the cap (memory holds {fits} tokens)")
        log.info("token budget: %d tokens a row, %s; a step trains %d samples", budget, how, self.pace.per_step)
        if fits < longest:
            log.warning("the trainer's free memory holds %d tokens a row, less than vLLM's max_model_len %d: "
                        "a long sample may run out of memory (gradient_checkpointing: true, or set token_budget)",
                        fits, longest)
        return budget

    async def pull(self, stop: asyncio.Event) -> StepInput | None:
        """Gather one step (see the module's docstring). None once `stop` is set."""
        out = StepInput([])
        while not out.batches:  # a flush closes nothing while a rank's row would stay empty
            if not await self._gather(out, stop):
                return None
            self._flush_into(out)
        return out

    async def _gather(self, out: StepInput, stop: asyncio.Event) -> bool:
        """Take groups until the step is full (or trainer.idle_flush_s passed); False once `stop` is set."""
        last_check = time.monotonic()
        flush_after = self.cfg.trainer.idle_flush_s
        while not self._step_full(out):
            if stop.is_set():
                return False
            if self._take_group(out):
                continue
            t = time.monotonic()
            partial = bool(flush_after and (out.batches or self._batcher.num_samples))
            self.idle.busy(False)
            got = await self.buffer.wait_nonempty(flush_after if partial and flush_after else 1.0)
            self.idle.busy(True)
            out.wait_s += time.monotonic() - t
            if got:
                continue
            if partial:
                break  # trainer.idle_flush_s: train the partial step
            if time.monotonic() - last_check > self.cfg.trainer.reconcile_interval_s:
                await self.reconcile()
                last_check = time.monotonic()
        return True

    def version_moved(self) -> None:
        """The trainer's version moved: samples left in open rows (a step's flush leaves them only
        when they cannot fill every rank's row) may have become stale (a group leaves whole: none
        of an open group was trained), and incomplete groups may have waited past the bound.
        Consumption now counts against the new version."""
        late_groups = {s.group_id for s in self._batcher.open_samples if self.is_stale(s)}
        late = self._batcher.evict(lambda s: s.group_id in late_groups)
        if late:
            self.ledger.release(late)
            self._drop_stale(late)
        waited_out = self.buffer.evict_incomplete(self.is_group_stale)
        if waited_out:
            self._drop_stale(waited_out)
        self.intake.version_moved(self._batcher.num_samples)

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

    def _step_full(self, out: StepInput) -> bool:
        """The step holds samples_per_step samples, or every prompt the run has left to train."""
        in_step = out.samples + self._batcher.open_samples
        if len(in_step) < self.num_rows:
            return False  # every rank's row needs a sample
        if len(in_step) >= self.pace.per_step:
            return True
        to_go = self._prompts_to_go()
        return to_go is not None and len({tuple(s.prompt_key) for s in in_step}) >= to_go

    def _prompts_to_go(self) -> int | None:
        """Prompts the run still has to train (None: unbounded, or not yet known)."""
        if self.cfg.max_steps > 0:
            return None
        target = self.ledger.target_prompts(self.cfg.num_train_epochs)
        return max(1, target - self.ledger.prompts_trained) if target else None

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
