"""The training loop: pull a step, train it, publish the weights, log, checkpoint.

Runs on the event loop; the blocking parts (forward/backward, serialising weights,
checkpoints) run in a worker thread so PushSamples, WatchPolicy and health stay
responsive. The loop owns only the loop and a step's bookkeeping (ledger, audit log, acks);
gathering a step is gathering.py's, versions and their weights publisher.py's, a step's
metrics step_report.py's. Generation credits for the next version open only once a version
is published.

Stops at `max_steps` (> 0) or once ceil(num_train_epochs x prompts_per_epoch)
distinct prompt keys are trained; then checkpoints (save_strategy="steps") and
tells producers done.
"""

from __future__ import annotations

import asyncio
import math
import time
from functools import partial
from pathlib import Path

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.logging import get_logger
from agrpo.services.common.metrics import IdleClock

from . import budget, checkpoint
from .audit import TrainedSampleLog
from .buffer import SampleBuffer
from .engine import Engine
from .gathering import StepGatherer, StepInput
from .intake import Intake
from .metrics import StepLogger, TrainerMetrics
from .policy import PolicyBoard
from .profiling import StepProfiler
from .publisher import WeightPublisher
from .ranks import RankGroup
from .reward_health import RewardHealth
from .run_record import RunRecord
from .sample import Outcome
from .state import TrainState
from .step_metrics import FlopModel
from .step_report import StepReporter

log = get_logger("trainer.loop")


class TrainerLoop:
    """pull -> train -> publish -> log -> checkpoint, until done or stopped."""

    def __init__(self, cfg: AgrpoConfig, engine: Engine, tokenizer, syncer,
                 state: TrainState, buffer: SampleBuffer, intake: Intake, board: PolicyBoard,
                 metrics: TrainerMetrics, step_log: StepLogger, record: RunRecord, ranks: RankGroup) -> None:
        self.cfg, self.engine, self.tokenizer, self.syncer = cfg, engine, tokenizer, syncer
        self.ranks = ranks  # the trainer's ranks: every collective goes through it (ranks.py)
        self.state, self.intake, self.record, self.metrics = state, intake, record, metrics
        self.ledger = state.ledger
        self.audit = TrainedSampleLog(Path(cfg.resolved_output_dir) / "trained_samples.jsonl")
        self.idle = IdleClock()  # waiting for samples vs training, syncing, logging
        self.publisher = WeightPublisher(cfg, syncer, state, board, record, metrics, intake, ranks)
        self.gatherer = StepGatherer(cfg, state, buffer, intake, metrics, ranks.world.size, self.idle,
                                     lambda: self.publisher.max_model_len, self.publisher.reconcile,
                                     partial(budget.engine_budget, engine, bool(cfg.gradient_checkpointing)))
        flops = FlopModel.of(engine.model, tree=engine.cfg.tree, recompute=bool(cfg.gradient_checkpointing))
        self.reporter = StepReporter(cfg, state, metrics, step_log, tokenizer, flops, self.idle, self.gatherer,
                                     self.publisher)
        self.reward_health = RewardHealth(cfg.trainer.reward_failure_patience)
        self.profiler = StepProfiler(cfg.trainer.profile_steps, cfg.resolved_output_dir, engine.device.type == "cuda")
        self._saved_step = state.step
        self._saved_epochs = state.ledger.completed_epochs
        self._stop = asyncio.Event()
        self.finished = asyncio.Event()

    @property
    def drops(self):
        """Samples not trained, by reason."""
        return self.gatherer.drops

    def token_budget(self) -> int | None:
        """The most tokens a sample may have (ModelLimits, for the intake)."""
        return self.gatherer.token_budget()

    def vocab_size(self) -> int | None:
        """The model's vocabulary size (ModelLimits): every token id must index it."""
        return self.engine.model.get_input_embeddings().num_embeddings

    async def cold_sync(self) -> None:
        """Every server gets the starting weights; then the planner knows their max_model_len."""
        await self.publisher.cold_sync()
        self.gatherer.start()

    def done(self) -> bool:
        if self.cfg.max_steps > 0:
            return self.state.step >= self.cfg.max_steps
        return self.ledger.reached(self.cfg.num_train_epochs)

    def stop(self) -> None:
        """Finish the step in progress and start no other (the buffer's waiter is released)."""
        if not self._stop.is_set():
            log.info("stop requested after step %d: finishing the step in progress", self.state.step)
        self._stop.set()
        self.gatherer.buffer.wake()

    async def run(self) -> None:
        """Train until done or stopped."""
        self.idle.start(busy=True)
        try:
            while not self.done() and not self._stop.is_set():
                self.profiler.before_step(self.state.step + 1)
                step_in = await self.gatherer.pull(self._stop)
                if step_in is None:
                    break
                await self.publisher.hold_generation()
                stats = await self.train_step(step_in)
                if self.state.step % self.cfg.weight_sync_steps == 0 and not self._stop.is_set():
                    await self.publish_weights()  # no weights leave after a stop began
                await self.publisher.release_generation()
                self.reporter.log(step_in, stats)
                await self._write_profile(self.profiler.after_step(self.state.step))
                await self.maybe_checkpoint()
            await self.publisher.settle()
            if self.done():
                await self.finish()
            elif self._stop.is_set() and self.cfg.save_strategy != "no" and self.state.step > self._saved_step:
                log.info("stopped at step %d: saving a checkpoint", self.state.step)
                await self.save()
        finally:
            await self._write_profile(self.profiler.close())
            await self.publisher.drain()
            await self.publisher.release_generation()  # a failed step leaves no server paused
            self.finished.set()

    @staticmethod
    async def _write_profile(write) -> None:
        """The profile's tables and timeline, written off the event loop (gRPC keeps answering);
        one that cannot be written costs a warning, never the run."""
        if write is None:
            return
        try:
            await asyncio.to_thread(write)
        except Exception as exc:  # noqa: BLE001 - a diagnostic
            log.warning("the profile could not be written: %s: %s", type(exc).__name__, exc)

    async def publish_weights(self) -> None:
        """The trainer's weights become the next version; what waited in open rows is judged
        against it; then they go into every server (maybe while the next step trains)."""
        version = await self.publisher.snapshot_next()
        self.gatherer.version_moved()
        await self.publisher.push(version)

    async def finish(self) -> None:
        log.info("training done at step %d (%d prompts trained)", self.state.step, self.ledger.prompts_trained)
        if self.cfg.save_strategy in ("steps", "epoch") and self.state.step > self._saved_step:
            await self.save()
        self.record.finish()
        self.intake.finish()

    async def train_step(self, step_in: StepInput) -> dict:
        """One optimizer step in a worker thread, then ledger, audit log, acks and counters."""
        t0 = time.perf_counter()
        versions = {s.policy_version for s in step_in.samples}
        staleness = {v: self._staleness(v) for v in versions}
        stats = await asyncio.to_thread(self.ranks.train_step, step_in.batches, staleness)
        stats["perf/step_s"] = time.perf_counter() - t0
        samples = step_in.samples
        for warning in self.reward_health.check(samples):  # raises when rewards stay unusable
            log.warning("%s", warning)
        self.ledger.record(samples)
        step_in.trained_version = self.state.version
        step_in.staleness = [self._staleness(s.policy_version) for s in samples]
        self.state.step += 1
        self.audit.write(self.state.step, self.state.version, samples, step_in.staleness)
        self.intake.settle(samples, Outcome.TRAINED)
        self.metrics.trained.inc(len(samples))
        self.metrics.step.set(self.state.step)
        self.metrics.step_time.observe(stats["perf/step_s"])
        return stats

    def _staleness(self, policy_version: int) -> int:
        """A trained sample's distance on the lineage: the gatherer took it fresh, so on the
        lineage (which only grows while the trainer runs)."""
        distance = self.state.staleness(policy_version)
        assert distance is not None
        return distance

    # Checkpoints
    def _save_every(self) -> int:
        every = self.cfg.save_steps
        if every < 1:
            every = math.ceil(every * self.cfg.max_steps) if self.cfg.max_steps > 0 else 500
        return max(1, int(every))

    async def maybe_checkpoint(self) -> None:
        """save_strategy as TRL: every save_steps steps, or at the end of each epoch."""
        epochs = self.ledger.completed_epochs
        due = (self.cfg.save_strategy == "steps" and self.state.step % self._save_every() == 0) or \
            (self.cfg.save_strategy == "epoch" and epochs > self._saved_epochs)
        self._saved_epochs = epochs
        if due:
            await self.save()

    async def save(self) -> None:
        self._saved_step = self.state.step
        await asyncio.to_thread(
            checkpoint.save, self.cfg.resolved_output_dir, self.state, self.engine.model, self.tokenizer,
            self.engine.optimizer, self.engine.scheduler, self.cfg.save_total_limit, self.cfg.save_only_model,
            self.ranks.save_shards if self.ranks.sharded else None)
