"""The reward service: `agrpo reward [--config FILE] [--reward.port N] ...`.

Serves RewardService (Score, ScoreStream, ListRewardFunctions) with health,
reflection and Prometheus metrics. Reward code runs in a pool of worker processes
(`reward.num_workers`) under a per-call deadline (`reward.call_timeout_s`). Health
stays NOT_SERVING until the workers have loaded the configured functions.

In-process (tests, benchmarks):

    svc = await build(cfg); port = await svc.start(); ...; await svc.stop()
"""

from __future__ import annotations

import asyncio

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.logging import get_logger, setup_logging
from agrpo.services.common.server import GrpcServer, StopSignals

from .app import RewardApp
from .call_metrics import CallCounter
from .pool import WorkerStartError
from .servicer import SERVICE_NAME, RewardServicer

log = get_logger("reward")


class RewardService:
    """The gRPC server plus the app behind it; `start()` then `stop()`."""

    def __init__(self, cfg: AgrpoConfig) -> None:
        self.cfg = cfg
        self.app = RewardApp(cfg)
        self.servicer = RewardServicer(self.app.metrics)
        counter = CallCounter(SERVICE_NAME, self.app.metrics.record_request)
        self.grpc_server = GrpcServer(cfg.reward, [SERVICE_NAME], self.servicer.register,
                                      tls=cfg.tls, auth=cfg.auth, interceptors=[counter])
        self.metrics_port: int | None = None

    @property
    def port(self) -> int:
        """The bound gRPC port."""
        return self.grpc_server.port

    async def start(self) -> int:
        """Listen (NOT_SERVING), start the workers, then report SERVING; return the port."""
        await self.grpc_server.start()
        self.metrics_port = self.app.metrics.serve(self.cfg.reward.metrics_port, self.cfg.reward.host)
        try:
            self.servicer.scorer = await self.app.start()
        except BaseException:
            await self.grpc_server.stop(0)
            raise
        await self.grpc_server.set_serving(True)
        return self.port

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain and stop the gRPC server, then the workers."""
        await self.grpc_server.stop(grace_s)
        await self.app.close()


async def build(cfg: AgrpoConfig) -> RewardService:
    """A reward service for `cfg`, not started yet."""
    return RewardService(cfg)


async def serve(cfg: AgrpoConfig) -> int:
    """Run until SIGTERM/SIGINT; 1 when the reward functions cannot be loaded or the
    config is refused (e.g. an empty auth.token_file)."""
    signals = StopSignals().install()  # first thing: a stop also ends the workers' start
    try:
        svc = await build(cfg)
        await svc.start()
    except (WorkerStartError, ValueError) as exc:
        log.error("cannot start the reward service: %s", exc)
        return 1
    try:
        await svc.grpc_server.wait_for_stop(signals)
    finally:
        await svc.app.close()
    return 0


def preflight(cfg: AgrpoConfig) -> None:
    """One-line start-up errors (services/common/preflight.py): ports, function names."""
    from agrpo.services.common.preflight import check_service_ports

    from .registry import check_names

    check_service_ports(cfg, "reward")
    check_names(cfg)


def main(cfg: AgrpoConfig) -> int:
    """`agrpo reward` entry point."""
    setup_logging("reward", cfg.log_format, cfg.log_level)
    log.info("config", extra={"reward": cfg.reward.model_dump(mode="json"),
                              "reward_funcs": [f.model_dump() for f in cfg.reward_funcs]})
    return asyncio.run(serve(cfg))
