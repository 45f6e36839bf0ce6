"""Wire the reward service together: function specs, the worker pool, the scorer, metrics.

`start()` starts the worker processes (each loads the configured functions) and then
builds the Scorer the servicer calls; `close()` stops the workers. No gRPC here:
services/reward/server.py serves this app.
"""

from __future__ import annotations

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.logging import get_logger

from .metrics import RewardMetrics
from .pool import WorkerPool
from .registry import specs_from_config
from .scorer import Scorer

log = get_logger("reward.app")


class RewardApp:
    """The reward functions behind the API: None scorer until the workers are up."""

    def __init__(self, cfg: AgrpoConfig) -> None:
        self.cfg = cfg
        section = cfg.reward
        self.metrics = RewardMetrics()
        self.specs = specs_from_config(cfg)
        self.pool = WorkerPool(self.specs, section.num_workers, section.start_method,
                               section.worker_start_timeout_s, self.metrics.on_pool_event)
        self.scorer: Scorer | None = None

    async def start(self) -> Scorer:
        """Start the workers (they load the functions); then scoring can begin."""
        section = self.cfg.reward
        infos = await self.pool.start()
        self.scorer = Scorer(infos, self.pool, self.metrics, max_items=section.max_items,
                             capacity=section.num_workers + section.max_queue,
                             num_workers=section.num_workers, call_timeout_s=section.call_timeout_s)
        log.info("reward functions ready", extra={
            "functions": [i.name for i in infos if i.default_enabled],
            "offered": [i.name for i in infos if not i.default_enabled],
            "workers": section.num_workers})
        return self.scorer

    async def close(self) -> None:
        await self.pool.close()
