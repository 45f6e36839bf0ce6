"""`agrpo rollout`: generate with vLLM, score with the reward service, stream to the trainer.

Run:  agrpo rollout --config run.yaml   (or: python -m agrpo.services.rollout ...)
Serves RolloutService (Heartbeat, GetStatus), grpc.health.v1 and reflection on
`rollout.port`, and Prometheus `agrpo_rollout_*` on `rollout.metrics_port`.
In-process (tests): `svc = await build(cfg); await svc.start(); ...; await svc.stop()`.
"""

from __future__ import annotations

import asyncio

from agrpo.services.common.logging import get_logger, setup_logging
from agrpo.services.common.preflight import StartupError
from agrpo.services.common.server import GrpcServer, StopSignals
from agrpo.v1 import common_pb2
from agrpo.v1 import rollout_service_pb2_grpc as rollout_grpc

from .app import RolloutApp
from .servicer import RolloutServicer
from .vllm_client import VLLMIncompatible

log = get_logger("rollout.server")
SERVICE = "agrpo.v1.RolloutService"


class RolloutService:
    """The gRPC server plus the app behind it."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.app = RolloutApp(cfg, trainer_state=self)  # called only once started, when grpc_server exists
        servicer = RolloutServicer(self.app)
        self.grpc_server = GrpcServer(cfg.rollout, [SERVICE],
                                      lambda s: rollout_grpc.add_RolloutServiceServicer_to_server(servicer, s),
                                      tls=cfg.tls if cfg.tls.enabled else None, auth=cfg.auth)
        self.port: int | None = None
        self.metrics_port: int | None = None

    async def start(self) -> int:
        """Serve, connect to vLLM/data/peers, start generating; return the gRPC port."""
        self.port = await self.grpc_server.start()
        self.metrics_port = self.app.metrics.m.serve(self.cfg.rollout.metrics_port, self.cfg.rollout.host)
        await self.app.setup()
        await self.app.run_background()
        self.app.identity.state = common_pb2.SERVING_STATE_SERVING
        await self.grpc_server.set_serving(True)
        return self.port

    async def on_trainer_state(self, stale: bool) -> None:
        """TrainerStateHook: a silent trainer makes RolloutService NOT_SERVING (the server stays up)."""
        from grpc_health.v1 import health_pb2

        status = (health_pb2.HealthCheckResponse.NOT_SERVING if stale
                  else health_pb2.HealthCheckResponse.SERVING)
        await self.grpc_server.health.set(SERVICE, status)

    async def stop(self) -> None:
        self.app.identity.state = common_pb2.SERVING_STATE_STOPPING
        await self.app.close()
        await self.grpc_server.stop()


async def build(cfg) -> RolloutService:
    """A rollout service, not started (call `await svc.start()`)."""
    return RolloutService(cfg)


async def serve(cfg) -> None:
    """Until a stop signal or the end of training; a signal also ends a wait for a peer."""
    signals = StopSignals().install()
    svc = await build(cfg)
    stop = asyncio.create_task(signals.requested.wait())
    try:
        start = asyncio.create_task(svc.start())
        await asyncio.wait([start, stop], return_when=asyncio.FIRST_COMPLETED)
        if not start.done():  # stopped while waiting for vLLM, the data or a peer
            start.cancel()
            await asyncio.gather(start, return_exceptions=True)
            return
        start.result()
        done_wait = asyncio.create_task(svc.app.finished.wait())
        await asyncio.wait([stop, done_wait], return_when=asyncio.FIRST_COMPLETED)
        if isinstance(svc.app.failure, StartupError):
            raise svc.app.failure  # the CLI prints it as one line (exit 2: no restart helps)
        if svc.app.failure is not None:
            raise RuntimeError("generation loop failed") from svc.app.failure
        if svc.app.finished.is_set():
            log.info("training is done; rollout exits")
    finally:
        stop.cancel()
        await svc.stop()


def preflight(cfg) -> None:
    """One-line start-up errors (services/common/preflight.py): ports, data, vLLM URLs."""
    from agrpo.services.common.preflight import check_dataset, check_service_ports, check_vllm_urls

    check_service_ports(cfg, "rollout")
    check_dataset(cfg)
    check_vllm_urls(cfg)


def main(cfg) -> int:
    setup_logging("rollout", cfg.log_format, cfg.log_level)
    log.info("config: %s", cfg.model_dump_json(exclude={"auth"}))
    try:
        asyncio.run(serve(cfg))
    except StartupError:
        raise
    except (TimeoutError, VLLMIncompatible, ValueError) as exc:  # expected start-up failures: one line
        log.error("cannot start the rollout service: %s", exc)
        raise StartupError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    except Exception as exc:  # anything else, with its traceback
        log.exception("rollout failed: %s", exc)
        return 1
    return 0
