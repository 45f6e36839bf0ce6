"""The trainer service: `agrpo trainer [--config FILE] [--key value ...]`.

Start-up: gRPC up with health NOT_SERVING -> load the model (or the latest
checkpoint) -> cold weight sync into every vLLM server (version 1, or the resumed
version) -> SERVING -> train until max_steps / the epoch bound, then report DONE and
keep serving status until stopped. In-process API for tests:
`app = await build(cfg); await app.start(); ...; await app.stop()`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.common.config import AgrpoConfig
from services.common.identity import Identity
from services.common.logging import get_logger, setup_logging
from services.common.server import GrpcServer

log = get_logger("trainer.server")
SERVICE_NAME = "agrpo.v1.TrainerService"


class TrainerApp:
    """Owns the gRPC server, the buffer/intake/ledger, the model and the loop."""

    def __init__(self, cfg: AgrpoConfig) -> None:
        from agrpo.v1 import common_pb2
        from agrpo.v1 import trainer_service_pb2_grpc as trainer_grpc

        from .buffer import SampleBuffer
        from .state import TrainState
        from .intake import Intake
        from .ledger import Ledger
        from .metrics import TrainerMetrics
        from .policy import PolicyBoard
        from .servicer import TrainerServicer

        self.cfg = cfg
        self._pb = common_pb2
        self.identity = Identity("trainer")
        self.state = TrainState(ledger=Ledger())
        self.buffer = SampleBuffer(cfg.queue_maxsize)
        self.board = PolicyBoard()
        self.metrics = TrainerMetrics()
        self.samples_received = 0
        self.intake_drops: dict[str, int] = {"duplicate": 0, "rejected": 0}
        self.intake = Intake(self.buffer, self.state.ledger, self._max_tokens, self._on_intake,
                             window=credit_window(cfg))
        self.loop = None
        self.ready = False
        self.servicer = TrainerServicer(self, self.identity)
        self.grpc_server = GrpcServer(cfg.trainer, [SERVICE_NAME],
                                      lambda s: trainer_grpc.add_TrainerServiceServicer_to_server(self.servicer, s),
                                      cfg.tls, cfg.auth)
        self.port = self.grpc_server.port
        self.metrics_port: int | None = None
        self._boot_task: asyncio.Task | None = None
        self._run_task: asyncio.Task | None = None
        self.failed: BaseException | None = None

    def _max_tokens(self) -> int | None:
        return self.loop.token_budget() if self.loop else None

    def _on_intake(self, kind: str, sample) -> None:
        if kind == "received":
            self.samples_received += 1
            self.metrics.received.inc()
        else:
            self.intake_drops[kind] = self.intake_drops.get(kind, 0) + 1
            self.metrics.dropped.labels(kind).inc()

    async def start(self, wait_ready: bool = True) -> int:
        """Serve gRPC now; load, cold-sync and train in the background."""
        await self.grpc_server.start()
        self.metrics_port = self.metrics.serve(self.cfg.trainer.metrics_port)
        self._boot_task = asyncio.create_task(self._boot())
        if wait_ready:
            await self.wait_ready()
        return self.port

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Until SERVING; re-raises a start-up failure."""
        await asyncio.wait_for(asyncio.shield(self._boot_task), timeout)

    async def _boot(self) -> None:
        try:
            self.loop = await asyncio.to_thread(self._build_loop)
            await self.loop.syncer.open()
            await self.loop.cold_sync()
        except BaseException as exc:
            self.failed = exc
            log.exception("trainer failed to start")
            raise
        self.ready = True
        self.identity.state = self._pb.SERVING_STATE_SERVING
        await self.grpc_server.set_serving(True)
        log.info("trainer serving at version %d (step %d)", self.state.version, self.state.step)
        self._run_task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            await self.loop.run()
            if self.loop.done():
                self.identity.state = self._pb.SERVING_STATE_DONE
        except BaseException as exc:
            self.failed = exc
            log.exception("training loop failed")
            raise

    def _build_loop(self):
        from .setup import build_loop

        return build_loop(self)

    async def wait_done(self, timeout: float | None = None) -> None:
        """Until the loop ends (training done or stopped)."""
        await self.wait_ready(timeout)
        await asyncio.wait_for(asyncio.shield(self._run_task), timeout)

    async def stop(self) -> None:
        self.identity.state = self._pb.SERVING_STATE_STOPPING
        if self.loop is not None:
            self.loop.stop()
        if self._run_task is not None and not self._run_task.done():
            # Let a step or weight sync in progress finish: never leave vLLM paused mid-update.
            await asyncio.wait([self._run_task], timeout=self.cfg.trainer.grace_s)
        for task in (self._run_task, self._boot_task):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self.board.close()
        for stream in list(self.intake.streams.values()):
            stream.send(None)
        await self.grpc_server.stop()
        if self.loop is not None:
            await self.loop.syncer.close()


def credit_window(cfg: AgrpoConfig) -> int:
    """Samples the trainer lets rollout buffer ahead: trainer.credit_window, or by default
    what max_staleness + 1 steps consume (more would only go stale), capped by queue_maxsize."""
    if cfg.trainer.credit_window:
        return min(cfg.trainer.credit_window, cfg.queue_maxsize)
    per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    return min(cfg.queue_maxsize, per_step * (cfg.max_staleness + 1))


async def build(cfg: AgrpoConfig) -> TrainerApp:
    """A trainer app, not started (binds its gRPC port)."""
    return TrainerApp(cfg)


async def serve(cfg: AgrpoConfig) -> int:
    app = await build(cfg)
    await app.start(wait_ready=False)
    waiter = asyncio.create_task(app.grpc_server.wait_for_stop())
    await asyncio.wait([waiter, app._boot_task], return_when=asyncio.FIRST_COMPLETED)
    if app.failed is not None:
        await app.stop()
        return 1
    await waiter
    await app.stop()
    return 0


def main(cfg: AgrpoConfig) -> int:
    """CLI entry point."""
    setup_logging("trainer", cfg.log_format)
    Path(cfg.resolved_output_dir).mkdir(parents=True, exist_ok=True)
    return asyncio.run(serve(cfg))
