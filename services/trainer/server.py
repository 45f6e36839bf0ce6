"""The trainer service: `agrpo trainer [--config FILE] [--key value ...]`.

Start-up: gRPC up with health NOT_SERVING -> load the model (or the latest
checkpoint) -> cold weight sync into every vLLM server (version 1, or the resumed
version) -> SERVING -> train until max_steps / the epoch bound, then report DONE and
keep serving status until stopped. In-process API for tests:
`svc = await build(cfg); await svc.start(); ...; await svc.stop()` (`svc.app` is the
TrainerApp: state, loop, metrics). A step goes server -> TrainerLoop.run -> RankGroup.train_step ->
Engine.train_step; the app only wires and boots.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.logging import get_logger, setup_logging
from agrpo.services.common.preflight import StartupError
from agrpo.services.common.server import GrpcServer, StopSignals
from agrpo.services.common.timeouts import RANK_SILENT_S, RANK_WATCH_PERIOD_S
from agrpo.v1 import common_pb2
from agrpo.v1 import trainer_service_pb2_grpc as trainer_grpc

from . import ranks
from .app import TrainerApp
from .ranks import World
from .servicer import TrainerServicer

log = get_logger("trainer.server")
SERVICE_NAME = "agrpo.v1.TrainerService"
GIL_SLICE_S = 0.0005
"""CPython's GIL switch interval in the serving rank (default 5 ms). The optimizer step runs in a
worker thread while the event loop takes samples, grants credits and pushes the last version into
vLLM; a step of many small ops holds the GIL in whole slices, so each hop of that push waited up to
one (measured: docs/measurements/async-measurements.md, the GIL switch interval)."""


class TrainerService:
    """The gRPC server plus the app behind it; boot and training run as background tasks."""

    def __init__(self, cfg: AgrpoConfig, world: World | None = None) -> None:
        self.cfg = cfg
        self.app = TrainerApp(cfg, world)
        servicer = TrainerServicer(self.app)
        self.grpc_server = GrpcServer(cfg.trainer, [SERVICE_NAME],
                                      lambda s: trainer_grpc.add_TrainerServiceServicer_to_server(servicer, s),
                                      cfg.tls, cfg.auth)
        self.port = self.grpc_server.port
        self.metrics_port: int | None = None
        self._boot_task: asyncio.Task | None = None
        self._run_task: asyncio.Task | None = None
        self._ranks_task: asyncio.Task | None = None
        self.failed: BaseException | None = None

    async def start(self, wait_ready: bool = True) -> int:
        """Serve gRPC now; load, cold-sync and train in the background."""
        await self.grpc_server.start()
        self.metrics_port = self.app.metrics.serve(self.cfg.trainer.metrics_port, self.cfg.trainer.host)
        self._boot_task = asyncio.create_task(self._boot())
        if self.app.ranks.world.size > 1:
            self._ranks_task = asyncio.create_task(self._watch_ranks())
        if wait_ready:
            await self.wait_ready()
        return self.port

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Until SERVING; re-raises a start-up failure."""
        assert self._boot_task is not None  # start() created it
        await asyncio.wait_for(asyncio.shield(self._boot_task), timeout)

    async def _boot(self) -> None:
        try:
            await self.app.boot()
        except StartupError as exc:  # the model or checkpoint cannot be loaded: one line
            self.failed = exc
            log.error("cannot start the trainer: %s", exc)
            raise
        except BaseException as exc:
            self.failed = exc
            log.exception("trainer failed to start")
            raise
        self.app.identity.state = common_pb2.SERVING_STATE_SERVING
        await self.grpc_server.set_serving(True)
        self._run_task = asyncio.create_task(self._run())

    async def _watch_ranks(self, every_s: float = RANK_WATCH_PERIOD_S, silent_s: float = RANK_SILENT_S) -> None:
        """Health reflects every rank: NOT_SERVING while a rank waiting for work stops beating."""
        silent_before: list[int] = []
        while True:
            await asyncio.sleep(every_s)
            silent = await asyncio.to_thread(self.app.ranks.silent, silent_s)
            if silent != silent_before and self.app.identity.state == common_pb2.SERVING_STATE_SERVING:
                if silent:
                    log.warning("trainer ranks %s silent for %.0f s: health NOT_SERVING", silent, silent_s)
                else:
                    log.info("every trainer rank answers again: health SERVING")
                await self.grpc_server.set_serving(not silent)
            silent_before = silent

    async def _run(self) -> None:
        try:
            loop = self.app.loop
            assert loop is not None  # _run starts only after boot() built it
            await loop.run()  # the step path: server -> TrainerLoop -> RankGroup -> Engine
            if loop.done():
                self.app.identity.state = common_pb2.SERVING_STATE_DONE
        except StartupError as exc:  # e.g. no usable reward: the run cannot work, one line
            self.failed = exc
            log.error("%s", exc)
        except BaseException as exc:
            self.failed = exc
            log.exception("training loop failed")
            raise

    async def wait_done(self, timeout: float | None = None) -> None:
        """Until the loop ends (training done or stopped)."""
        await self.wait_ready(timeout)
        assert self._run_task is not None  # a boot that returned (wait_ready) created it
        await asyncio.wait_for(asyncio.shield(self._run_task), timeout)

    async def stop(self) -> None:
        """Finish the step in progress (no weights pushed after this; a checkpoint if
        save_strategy asks for one), then close the streams and the gRPC server."""
        self.app.identity.state = common_pb2.SERVING_STATE_STOPPING
        self.app.stop_training()
        if self._run_task is not None and not self._run_task.done():
            # Never cut a step or a weight sync short: vLLM must not stay paused mid-update.
            await asyncio.wait([self._run_task])
        for task in (self._run_task, self._boot_task, self._ranks_task):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.app.close()
        await self.grpc_server.stop()


async def build(cfg: AgrpoConfig, world: World | None = None) -> TrainerService:
    """A trainer service (rank 0 of `world`), not started (binds its gRPC port)."""
    return TrainerService(cfg, world)


async def serve(cfg: AgrpoConfig, world: World | None = None) -> int:
    """Until a stop signal (or, with trainer.exit_when_done, the end of training)."""
    signals = StopSignals().install()
    svc = await build(cfg, world)
    await svc.start(wait_ready=False)
    boot_task = svc._boot_task
    assert boot_task is not None  # start() created it
    stop = asyncio.create_task(signals.requested.wait())
    await asyncio.wait([stop, boot_task], return_when=asyncio.FIRST_COMPLETED)
    if svc.failed is None and svc._run_task is not None:
        await asyncio.wait([stop, svc._run_task], return_when=asyncio.FIRST_COMPLETED)
        if svc._run_task.done() and svc.failed is None and not cfg.trainer.exit_when_done:
            await stop  # training is done: keep answering status until stopped
    stop.cancel()
    if boot_task.done() and not boot_task.cancelled():
        boot_task.exception()  # retrieved: a failure was logged where it happened
    await svc.stop()
    if isinstance(svc.failed, StartupError):
        raise svc.failed  # the CLI prints it as one line and exits 2
    return 1 if svc.failed is not None else 0


def preflight(cfg: AgrpoConfig) -> None:
    """One-line start-up errors (services/common/preflight.py): ports, model, vLLM URLs, resume."""
    from agrpo.services.common.preflight import check_model, check_service_ports, check_vllm_urls

    if ranks.world_from_env().leader:  # only rank 0 listens
        check_service_ports(cfg, "trainer")
    check_model(cfg)
    check_vllm_urls(cfg)
    if cfg.trainer.cpu_offload:
        import torch

        if cfg.use_cpu or not torch.cuda.is_available():
            raise StartupError("trainer.cpu_offload: offloads a GPU's training state to the CPU; "
                               "this trainer has no GPU (turn it off on CPU)")


def main(cfg: AgrpoConfig) -> int:
    """CLI entry point; under torchrun, rank 0 serves and the other ranks follow it."""
    setup_logging("trainer", cfg.log_format, cfg.log_level)
    if "WORLD_SIZE" not in os.environ:
        per_node = ranks.ranks_on_this_node(cfg.trainer.num_processes)
        if per_node > 1 or int(os.environ.get("PET_NNODES", "1") or 1) > 1:
            ranks.run_ranks(per_node)  # does not return
    world = ranks.world_from_env()
    if world.size > 1 or ranks.sharded(cfg):
        import torch

        ranks.init(world, cfg.trainer.collective_timeout_s, torch.cuda.is_available() and not cfg.use_cpu,
                   ranks.sharded(cfg))
    if not world.leader:
        return ranks.leave(ranks.follow(cfg, world))
    Path(cfg.resolved_output_dir).mkdir(parents=True, exist_ok=True)
    if cfg.trainer.threads:
        import torch

        torch.set_num_threads(cfg.trainer.threads)
    sys.setswitchinterval(GIL_SLICE_S)
    return ranks.leave(asyncio.run(serve(cfg, world)))
