"""The reward service: `agrpo reward [--config FILE] [--reward.port N] ...`.

Serves RewardService (Score, ScoreStream, ListRewardFunctions) with health,
reflection and Prometheus metrics. Reward code runs in a pool of worker processes
(`reward.num_workers`) under a per-call deadline (`reward.call_timeout_s`). Health
stays NOT_SERVING until the workers have loaded the configured functions.

In-process (tests, benchmarks):

    server = await build(cfg); port = await server.start(); ...; await server.stop()
"""

from __future__ import annotations

import asyncio

from services.common.config import AgrpoConfig
from services.common.logging import get_logger, setup_logging
from services.common.server import GrpcServer

from .metrics import RewardMetrics
from .pool import WorkerPool, WorkerStartError
from .registry import specs_from_config
from .scorer import Scorer
from .servicer import SERVICE_NAME, RewardServicer

log = get_logger("reward")


class RewardServer:
    """The gRPC server, its worker pool and metrics; `start()` then `stop()`."""

    def __init__(self, cfg: AgrpoConfig) -> None:
        self.cfg = cfg
        section = cfg.reward
        self.metrics = RewardMetrics()
        self.specs = specs_from_config(cfg)
        self.pool = WorkerPool(self.specs, section.num_workers, section.start_method,
                               section.worker_start_timeout_s, self.metrics.on_pool_event)
        self.servicer = RewardServicer(self.metrics)
        self.grpc_server = GrpcServer(section, [SERVICE_NAME], self.servicer.register,
                                      tls=cfg.tls, auth=cfg.auth)
        self.metrics_port: int | None = None

    @property
    def port(self) -> int:
        """The bound gRPC port."""
        return self.grpc_server.port

    async def start(self) -> int:
        """Listen (NOT_SERVING), start the workers, then report SERVING; return the port."""
        section = self.cfg.reward
        await self.grpc_server.start()
        self.metrics_port = self.metrics.serve(section.metrics_port)
        try:
            infos = await self.pool.start()
            self.servicer.scorer = Scorer(
                infos, self.pool, self.metrics, max_items=section.max_items,
                capacity=section.num_workers + section.max_queue,
                call_timeout_s=section.call_timeout_s)
        except BaseException:
            await self.grpc_server.stop(0)
            raise
        await self.grpc_server.set_serving(True)
        log.info("reward functions ready", extra={
            "functions": [i.name for i in infos if i.default_enabled],
            "offered": [i.name for i in infos if not i.default_enabled],
            "workers": section.num_workers, "metrics_port": self.metrics_port})
        return self.port

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain and stop the gRPC server, then the workers."""
        await self.grpc_server.stop(grace_s)
        await self.pool.close()


async def build(cfg: AgrpoConfig) -> RewardServer:
    """A reward server for `cfg`, not started yet."""
    return RewardServer(cfg)


async def serve(cfg: AgrpoConfig) -> int:
    """Run until SIGTERM/SIGINT; 1 when the reward functions cannot be loaded."""
    server = await build(cfg)
    try:
        await server.start()
    except (WorkerStartError, ValueError) as exc:
        log.error("cannot start the reward service: %s", exc)
        return 1
    try:
        await server.grpc_server.wait_for_stop()
    finally:
        await server.pool.close()
    return 0


def main(cfg: AgrpoConfig) -> int:
    """`agrpo reward` entry point."""
    setup_logging("reward", cfg.log_format)
    log.info("config", extra={"reward": cfg.reward.model_dump(mode="json"),
                              "reward_funcs": [f.model_dump() for f in cfg.reward_funcs]})
    return asyncio.run(serve(cfg))
