"""The training loop: pull_batch -> train_step -> publish_weights -> log_step.

Runs on the event loop; the blocking parts (forward/backward, serialising weights,
checkpoints) run in a worker thread so PushSamples, WatchPolicy and health stay
responsive. One optimizer step consumes `gradient_accumulation_steps` micro-batches
from the planner; a micro-batch also closes when no sample arrived for
`trainer.idle_flush_s` (the tail of an epoch, or a slow producer), and a step may
then have fewer micro-batches (the loss is averaged over those it has). Under
`trainer.schedule: sync` a step is exactly what was generated for it (pacing.py).
Generation credits for the next version open only once a version is published.

Stops at `max_steps` (> 0) or once ceil(num_train_epochs x prompts_per_epoch)
distinct prompt keys are trained; then checkpoints (save_strategy="steps") and
tells producers done.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.logging import get_logger
from agrpo.services.common.metrics import IdleClock
from agrpo.services.common.versions import Lineage, label_to_version

from . import checkpoint
from .audit import TrainedSampleLog
from .buffer import SampleBuffer
from .engine import Engine
from .intake import OTHER_GROUP, Intake
from .metrics import StepLogger, TrainerMetrics
from .packing import MicroBatch, make_batcher
from .policy import PolicyBoard
from .reward_health import RewardHealth
from .ranks import RankGroup
from .run_record import RunRecord
from .sample import Outcome, Sample
from .state import TrainState
from .step_metrics import FlopModel, step_metrics
from .weight_sync import WeightSyncer

log = get_logger("trainer.loop")


@dataclass
class StepInput:
    """What pull_batch gathered for one optimizer step."""

    batches: list[MicroBatch]
    wait_s: float = 0.0
    stale: list[Sample] = field(default_factory=list)
    trained_version: int = 0  # the trainer's version when the step trained (before publishing)
    staleness: list[int] = field(default_factory=list)  # per trained sample, positions on the lineage


class TrainerLoop:
    """Owns the training state and drives steps, syncs, logs and checkpoints."""

    def __init__(self, cfg: AgrpoConfig, engine: Engine, tokenizer, syncer: WeightSyncer,
                 state: TrainState, buffer: SampleBuffer, intake: Intake, board: PolicyBoard,
                 metrics: TrainerMetrics, step_log: StepLogger, record: RunRecord, ranks: RankGroup) -> None:
        self.cfg, self.engine, self.tokenizer, self.syncer = cfg, engine, tokenizer, syncer
        self.ranks = ranks  # the trainer's ranks: every collective goes through it (ranks.py)
        self.record = record  # run.json: the version high-water mark
        self.state, self.buffer, self.intake, self.board = state, buffer, intake, board
        self.metrics, self.step_log = metrics, step_log
        self.ledger = state.ledger
        self.audit = TrainedSampleLog(Path(cfg.resolved_output_dir) / "trained_samples.jsonl")
        self.flops = FlopModel.of(engine.model, tree=engine.cfg.tree,
                                  recompute=bool(cfg.gradient_checkpointing))
        self.pace = intake.pace
        self.trained_at_version = 0  # samples trained since the last published version
        self._pushing: asyncio.Task | None = None  # a weight push overlapping the next step
        self.idle = IdleClock()  # waiting for samples vs training, syncing, logging
        self.reward_health = RewardHealth(cfg.trainer.reward_failure_patience)
        self._saved_step = state.step
        self._saved_epochs = state.ledger.completed_epochs
        self._clock_seen = (0.0, 0.0)
        self.max_model_len: int | None = None
        self.batcher = None
        self.drops: Counter = Counter()  # samples not trained, by reason (stale, oversize, duplicate_prompt)
        self.last_sync: dict[str, float] = {}
        self._stop = asyncio.Event()
        self.finished = asyncio.Event()

    # Setup
    def token_budget(self) -> int | None:
        """The batcher's budget in force (None until the server's max_model_len is known)."""
        budget = self.cfg.token_budget
        if budget is None:
            return self.max_model_len
        return budget if budget > 0 else None

    def _make_batcher(self) -> None:
        # One row per rank in every micro-batch (TRL's num_processes): rank r trains row r.
        self.batcher = make_batcher(self.cfg.token_budget, self.max_model_len or 0, self.ranks.world.size,
                                    self.cfg.per_device_train_batch_size, self._on_oversize,
                                    self.cfg.trainer.max_samples_per_micro_batch)

    def _on_oversize(self, sample: Sample, reason: str) -> None:
        self.pace.release(1)
        self._count_drop("oversize")
        self.intake.settle([sample], Outcome.REJECTED, reason)
        log.warning("dropped sample %s: %s", sample.sample_id, reason)

    def _count_drop(self, reason: str, n: int = 1) -> None:
        self.drops[reason] += n
        self.metrics.dropped.labels(reason).inc(n)

    def _prepare_payload(self, version: int):
        named = self.ranks.weights(wire_dtype(self.cfg.trainer.sync_dtype))  # gathered, then sent alone
        return self.syncer.transport.prepare(named, version)

    # Weight sync
    async def cold_sync(self) -> None:
        """Sync every server before serving; retry until vllm_server_timeout."""
        version = await self._start_version()
        deadline = time.monotonic() + self.cfg.vllm_server_timeout
        pending, uri = list(self.syncer.urls), ""
        while True:
            try:
                self.max_model_len = self.max_model_len or await self.syncer.admin(pending[0]).max_model_len()
                report = await self._sync(version, pending)
                pending, uri = list(report.errors), report.uri
            except Exception as exc:  # noqa: BLE001 - retried until the deadline
                log.warning("cold sync: %s", exc)
            if not pending:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"cold sync failed for {pending} after {self.cfg.vllm_server_timeout:.0f} s")
            await asyncio.sleep(2.0)
        self._make_batcher()
        self._commit_version(version, list(self.syncer.urls), uri)

    async def _start_version(self) -> int:
        """The version the loaded weights are published as: never a number published before
        for other weights (run.json's high-water mark, and what the servers report)."""
        s, labels = self.state, []
        for url in self.syncer.urls:
            try:
                labels.append(label_to_version(await self.syncer.admin(url).weight_label()))
            except Exception:  # noqa: BLE001 - a server not up yet: the cold sync retries it
                pass
        high = max([self.record.max_version, *(v for v in labels if v is not None)])
        if s.version > 0 and s.version_step == s.step and high <= s.version:
            return s.version  # the checkpoint's weights, under the number they were published as
        version = high + 1
        if s.version > 0:
            s.lineage = s.lineage.resumed(s.version, version, ahead=int(s.version_step != s.step))
            log.warning("resumed weights of version %d are published as version %d: versions %d-%d "
                        "(weights this restart rolled back) are off the lineage and never trained",
                        s.version, version, s.version + 1, high)
        elif version > 1:
            s.lineage = Lineage(((version, None, 1),))  # a fresh run on servers that saw other versions
        return version

    async def _sync(self, version: int, urls: list[str] | None = None):
        self.record.reserve(version)  # before any weights of this number leave the trainer
        report = await self.syncer.sync(version, partial(self._prepare_payload, version), urls)
        for phase, secs in report.phase_s.items():
            self.metrics.sync_time.labels(phase).observe(secs)
        for err in report.errors.values():
            self.metrics.sync_failures.labels(err.phase).inc()
        self.last_sync = dict(report.phase_s)
        return report

    def _commit_version(self, version: int, synced: list[str], uri: str) -> None:
        self.state.version, self.state.version_step = version, self.state.step
        self._announce(version, self.state.step, synced, uri)

    def _announce(self, version: int, step: int, synced: list[str], uri: str) -> None:
        self.metrics.policy_version.set(version)
        self.board.publish(version, step, synced, self.syncer.transport.name, uri, self.state.lineage)
        log.info("policy version %d published (step %d, servers %s)", version, step, synced)

    async def publish_weights(self) -> None:
        """The trainer's weights become the next version (snapshotted), then go into every
        server and are announced (failed servers re-sync later). With overlap_weight_sync
        the push runs while the next step trains; it is awaited before anything else syncs."""
        await self.settle_push()
        version = self.state.version + 1
        self.record.reserve(version)  # before the checkpoint can hold it
        await self.syncer.prepare_now(version, partial(self._prepare_payload, version))
        self.state.version, self.state.version_step = version, self.state.step
        # Samples waiting in open rows were fresh when popped; a new version can make
        # them stale before their micro-batch closes. Never train past max_staleness; a group
        # leaves whole (none of an open group was trained: pull_batch keeps groups in one step).
        late_groups = {s.group_id for s in self.batcher.open_samples if self.is_stale(s)}
        late = self.batcher.evict(lambda s: s.group_id in late_groups)
        if late:
            self.ledger.release(late)
            self._drop_stale(late)
        waited_out = self.buffer.evict_incomplete(self.is_group_stale)
        if waited_out:
            self._drop_stale(waited_out)
        self.intake.version_moved(self.trained_at_version, self.batcher.num_samples)
        self.trained_at_version = 0
        push = self._push(version, self.state.step)
        overlap = self.cfg.trainer.overlap_weight_sync and not self.pace.sync and \
            self.syncer.transport.snapshot
        if overlap:
            self._pushing = asyncio.create_task(push)
        else:
            await push

    async def _push(self, version: int, step: int) -> None:
        report = await self._sync(version)
        self._announce(version, step, report.synced, report.uri)
        # Only now does the next generation's room open: it is generated at this version.
        self.intake.version_published()

    async def settle_push(self) -> None:
        """Wait for the push in flight (if any): vLLM must never stay paused mid-update."""
        if self._pushing is not None:
            pushing, self._pushing = self._pushing, None
            await pushing

    async def reconcile(self) -> None:
        """Re-sync servers that restarted or missed a version."""
        await self.settle_push()
        version = self.state.version
        try:
            report = await self.syncer.reconcile(version, partial(self._prepare_payload, version))
        except Exception:  # noqa: BLE001 - a failed check is retried next time
            log.exception("reconcile failed")
            return
        if report is not None:
            self.last_sync = dict(report.phase_s)
            if report.synced:
                self.board.publish(self.state.version, self.state.version_step, list(self.syncer.urls),
                                   self.syncer.transport.name, report.uri, self.state.lineage)

    # Steps
    def done(self) -> bool:
        if self.cfg.max_steps > 0:
            return self.state.step >= self.cfg.max_steps
        return self.ledger.reached(self.cfg.num_train_epochs)

    def stop(self) -> None:
        """Finish the step in progress and start no other (the buffer's waiter is released)."""
        if not self._stop.is_set():
            log.info("stop requested after step %d: finishing the step in progress", self.state.step)
        self._stop.set()
        self.buffer.wake()

    async def run(self) -> None:
        """Train until done or stopped."""
        self.idle.start(busy=True)
        try:
            while not self.done() and not self._stop.is_set():
                step_in = await self.pull_batch()
                if step_in is None:
                    break
                stats = await self.train_step(step_in)
                if self.state.step % self.cfg.weight_sync_steps == 0 and not self._stop.is_set():
                    await self.publish_weights()  # no weights leave after a stop began
                self.log_step(step_in, stats)
                await self.maybe_checkpoint()
            await self.settle_push()
            if self.done():
                await self.finish()
            elif self._stop.is_set() and self.cfg.save_strategy != "no" and self.state.step > self._saved_step:
                log.info("stopped at step %d: saving a checkpoint", self.state.step)
                await self.save()
        finally:
            if self._pushing is not None:  # a failed step: the push in flight still ends cleanly
                await asyncio.gather(self._pushing, return_exceptions=True)
            self.finished.set()

    async def finish(self) -> None:
        log.info("training done at step %d (%d prompts trained)", self.state.step, self.ledger.prompts_trained)
        if self.cfg.save_strategy in ("steps", "epoch") and self.state.step > self._saved_step:
            await self.save()
        self.record.finish()
        self.intake.finish()

    async def pull_batch(self) -> StepInput | None:
        """Gather one step of fresh samples: GA micro-batches (async), or everything that was
        generated for the step (sync schedule). Stale ones are dropped and acked."""
        out = StepInput([])
        last_check = time.monotonic()
        while not self._step_full(out):
            if self._stop.is_set():
                return None
            if self._take_group(out):
                continue
            t = time.monotonic()
            open_samples = self.batcher.num_samples
            timeout = self.cfg.trainer.idle_flush_s if (open_samples or out.batches) else 1.0
            self.idle.busy(False)
            got = await self.buffer.wait_nonempty(timeout)
            self.idle.busy(True)
            out.wait_s += time.monotonic() - t
            if got:
                continue
            if open_samples or out.batches:
                last = self.batcher.flush()
                if last is not None:
                    out.batches.append(last)
                if out.batches:
                    return out
            if time.monotonic() - last_check > self.cfg.trainer.reconcile_interval_s:
                await self.reconcile()
                last_check = time.monotonic()
        if self.pace.sync or self._splits_a_group(out):
            # Sync: the step trains exactly the samples generated for it. Async: a group larger
            # than a micro-batch left its tail open; it trains in this step too.
            last = self.batcher.flush()
            if last is not None:
                out.batches.append(last)
        return out

    def _splits_a_group(self, out: StepInput) -> bool:
        in_step = {s.group_id for mb in out.batches for s in mb.samples}
        return any(s.group_id in in_step for s in self.batcher.open_samples)

    def is_stale(self, sample: Sample) -> bool:
        """Past max_staleness at the trainer's version, or off its lineage (versions.py)."""
        return self.state.lineage.stale(self.state.version, sample.policy_version, self.cfg.max_staleness)

    def is_group_stale(self, group: list[Sample]) -> bool:
        """A group is as stale as its stalest row: it trains whole or not at all."""
        return any(self.is_stale(s) for s in group)

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
            self.metrics.staleness.observe(self.state.staleness(sample.policy_version))
        out.batches += self.batcher.add_group(group)
        return True

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

    async def train_step(self, step_in: StepInput) -> dict:
        """One optimizer step in a worker thread, then ledger, acks and counters."""
        t0 = time.perf_counter()
        versions = {s.policy_version for mb in step_in.batches for s in mb.samples}
        staleness = {v: self.state.staleness(v) for v in versions}
        stats = await asyncio.to_thread(self.ranks.train_step, step_in.batches, staleness)
        stats["perf/step_s"] = time.perf_counter() - t0
        samples = [s for mb in step_in.batches for s in mb.samples]
        for warning in self.reward_health.check(samples):  # raises when rewards stay unusable
            log.warning("%s", warning)
        self.ledger.record(samples)
        self.trained_at_version += len(samples)
        step_in.trained_version = self.state.version
        step_in.staleness = [self.state.staleness(s.policy_version) for s in samples]
        self.state.step += 1
        self.audit.write(self.state.step, self.state.version, samples, step_in.staleness)
        self.intake.settle(samples, Outcome.TRAINED)
        self.metrics.trained.inc(len(samples))
        self.metrics.step.set(self.state.step)
        self.metrics.step_time.observe(stats["perf/step_s"])
        return stats

    def log_step(self, step_in: StepInput, stats: dict) -> None:
        metrics = step_metrics(step_in, stats, version=self.state.version, ledger=self.ledger, drops=self.drops,
                               flops=self.flops, peak_tflops=self.cfg.trainer.peak_tflops,
                               last_sync=self.last_sync, token_budget=self.token_budget())
        self.last_sync = {}
        self.metrics.tokens_per_s.set(metrics.get("perf/tokens_per_s", 0.0))
        self.metrics.idle.set(metrics.get("perf/idle_fraction", 0.0))
        self.metrics.buffered.set(len(self.buffer))
        self.metrics.pacing_window.set(self.pace.window)
        self.metrics.mismatch_kl.set(metrics.get("mismatch/k3_kl_mean", 0.0))
        idle, total = self.idle.idle_s, self.idle.total_s
        seen_idle, seen_total = self._clock_seen
        self.metrics.idle_seconds.inc(max(0.0, idle - seen_idle))
        self.metrics.busy_seconds.inc(max(0.0, (total - idle) - (seen_total - seen_idle)))
        self._clock_seen = (idle, total)
        self.step_log.log(self.state.step, metrics, force=self.state.step == 1 and self.cfg.logging_first_step)
        every = max(1, int(self.cfg.logging_steps)) if self.cfg.logging_steps >= 1 else 1
        if self.cfg.log_completions and self.state.step % every == 0:
            self._print_completions(step_in)

    def _print_completions(self, step_in: StepInput) -> None:
        """TRL's log_completions: prompt, completion, each function's reward and the advantage."""
        samples = [s for mb in step_in.batches for s in mb.samples]
        shown = samples[:self.cfg.num_completions_to_print or len(samples)]
        lines = [f"step {self.state.step}: {len(shown)} of {len(samples)} completions"]
        for s in shown:
            prompt = s.prompt_text or self.tokenizer.decode(s.input_ids[:s.prompt_length])
            text = s.completion_text or self.tokenizer.decode(
                [t for t, m in zip(s.input_ids, s.completion_mask) if m])
            parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(s.reward_components.items()))
            lines += [f"  prompt:     {_one_line(prompt)}", f"  completion: {_one_line(text)}",
                      f"  reward {s.reward:.3f}" + (f" ({parts})" if parts else "") + f" | advantage {s.advantage:+.3f}"]
        log.info("%s", "\n".join(lines))

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


def wire_dtype(name: str):
    """Dtype of tensors on the wire: "auto" keeps the training dtype."""
    import torch

    return None if name == "auto" else getattr(torch, name)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + " ..."
