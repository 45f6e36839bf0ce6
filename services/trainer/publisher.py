"""Policy versions and their weights in every server: the only place a version is minted.

A version names one set of weights, forever: it is reserved in run.json before any weights
of that number leave the trainer, and a resumed trainer starts above every number it ever
published (`start_version`). Per version: the weights are snapshotted (`snapshot_next`), pushed
into every server (overlapping the next step where the transport snapshots and the schedule
is async), and announced on WatchPolicy; only then does the next generation's room open.
Servers that restarted or missed a version are re-synced (`reconcile`).
"""

from __future__ import annotations

import asyncio
import time
from functools import partial

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.logging import get_logger
from agrpo.services.common.preflight import StartupError
from agrpo.services.common.timeouts import COLD_SYNC_RETRY_S
from agrpo.services.common.versions import Lineage, adapter_name, label_to_version

from .intake import Intake
from .metrics import TrainerMetrics
from .policy import PolicyBoard
from .ranks import RankGroup
from .run_record import RunRecord
from .state import TrainState

log = get_logger("trainer.publisher")


class WeightPublisher:
    """Mints versions and gets their weights into the servers (syncer: WeightSyncer or LocalSyncer)."""

    def __init__(self, cfg: AgrpoConfig, syncer, state: TrainState, board: PolicyBoard, record: RunRecord,
                 metrics: TrainerMetrics, intake: Intake, ranks: RankGroup) -> None:
        self.cfg, self.syncer, self.state, self.board = cfg, syncer, state, board
        self.record, self.metrics, self.intake, self.ranks = record, metrics, intake, ranks
        self.max_model_len: int | None = None  # the servers', learnt at the cold sync
        self.last_sync: dict[str, float] = {}  # phase seconds of the last sync, for the step log
        self.last_sync_bytes = 0  # and its payload's size
        self._pushing: asyncio.Task | None = None  # a push overlapping the next step
        self._overlap = (cfg.trainer.overlap_weight_sync and cfg.trainer.resolved_schedule == "async"
                         and syncer.transport.snapshot)
        self._alternate = cfg.trainer.resolved_schedule == "alternate"

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
            except StartupError:  # a server that can never work for this run (its LoRA limits): no retry
                raise
            except Exception as exc:  # noqa: BLE001 - retried until the deadline
                log.warning("cold sync: %s", exc)
            if not pending:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"cold sync failed for {pending} after {self.cfg.vllm_server_timeout:.0f} s")
            await asyncio.sleep(COLD_SYNC_RETRY_S)
        self.state.version, self.state.version_step = version, self.state.step
        self._announce(version, self.state.step, list(self.syncer.urls), uri)

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
            if high > s.version:
                log.warning("resumed weights of version %d are published as version %d: versions %d-%d "
                            "(weights this restart rolled back) are off the lineage and never trained",
                            s.version, version, s.version + 1, high)
            else:  # the checkpoint's step came after its version's: weights never published before
                log.info("resumed weights (step %d) are published as version %d", s.step, version)
        elif version > 1:
            s.lineage = Lineage(((version, None, 1),))  # a fresh run on servers that saw other versions
        return version

    async def snapshot_next(self) -> int:
        """The trainer's weights become the next version: reserved, snapshotted (once this
        returns, training may change them where the transport snapshots), and the trainer's."""
        await self.settle()
        version = self.state.version + 1
        self.record.reserve(version)  # before the checkpoint can hold it
        await self.syncer.prepare_now(version, partial(self._prepare_payload, version))
        self.state.version, self.state.version_step = version, self.state.step
        return version

    async def push(self, version: int) -> None:
        """Into every server, then announced; in the background where it may overlap the next step
        (it is awaited before anything else syncs)."""
        push = self._push(version, self.state.step)
        if self._overlap:
            self._pushing = asyncio.create_task(push)
        else:
            await push

    async def _push(self, version: int, step: int) -> None:
        report = await self._sync(version)
        self._announce(version, step, report.synced, report.uri)
        # Only now does the next generation's room open: it is generated at this version.
        self.intake.version_published()

    async def settle(self) -> None:
        """Wait for the push in flight (if any): vLLM must never stay paused mid-update."""
        if self._pushing is not None:
            pushing, self._pushing = self._pushing, None
            await pushing

    async def hold_generation(self) -> None:
        """The alternate schedule: every server pauses while the trainer computes (its requests
        kept); the step's sync, or `release_generation`, resumes them."""
        if self._alternate:
            await self.settle()
            await self.syncer.hold()

    async def release_generation(self) -> None:
        """Resume what hold_generation paused and no sync resumed."""
        if self._alternate:
            await self.syncer.release()

    async def drain(self) -> None:
        """After a failed step: the push in flight still ends cleanly, its error aside."""
        if self._pushing is not None:
            await asyncio.gather(self._pushing, return_exceptions=True)

    async def reconcile(self) -> None:
        """Re-sync servers that restarted or missed a version."""
        await self.settle()
        version = self.state.version
        try:
            report = await self.syncer.reconcile(version, partial(self._prepare_payload, version))
        except Exception:  # a failed check is retried next time
            log.exception("reconcile failed")
            return
        if report is not None:
            self.last_sync = dict(report.phase_s)
            if report.synced:
                self.board.publish(self.state.version, self.state.version_step, list(self.syncer.urls),
                                   self.syncer.transport.name, report.uri, self.state.lineage,
                                   self._adapter(self.state.version))

    def _prepare_payload(self, version: int):
        dtype = wire_dtype(self.cfg.trainer.sync_dtype)
        if self.syncer.payload == "adapter":  # a LoRA adapter, for servers that serve it as one
            named = self.ranks.adapter(dtype)
        else:
            named = self.ranks.weights(dtype)  # gathered, then sent alone
        return self.syncer.payload_transport.prepare(named, version)

    async def _sync(self, version: int, urls: list[str] | None = None):
        self.record.reserve(version)  # before any weights of this number leave the trainer
        report = await self.syncer.sync(version, partial(self._prepare_payload, version), urls)
        for phase, secs in report.phase_s.items():
            self.metrics.sync_time.labels(phase).observe(secs)
        for err in report.errors.values():
            self.metrics.sync_failures.labels(err.phase).inc()
        self.last_sync, self.last_sync_bytes = dict(report.phase_s), report.nbytes
        return report

    def _adapter(self, version: int) -> str:
        """The adapter name rollout must request for `version` ("" when full weights are synced)."""
        return adapter_name(version) if self.syncer.payload == "adapter" else ""

    def _announce(self, version: int, step: int, synced: list[str], uri: str) -> None:
        self.metrics.policy_version.set(version)
        self.board.publish(version, step, synced, self.syncer.transport.name, uri, self.state.lineage,
                           self._adapter(version))
        log.info("policy version %d published (step %d, servers %s)", version, step, synced)


def wire_dtype(name: str):
    """Dtype of tensors on the wire: "auto" keeps the training dtype."""
    import torch

    return None if name == "auto" else getattr(torch, name)
