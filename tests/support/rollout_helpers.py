"""Helpers of the rollout integration tests: data, config, a running rollout service, waiting."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

from agrpo.services.common.config import AgrpoConfig

NUM_PROMPTS = 12

def write_dataset(path: Path, n: int = NUM_PROMPTS) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            row = {"prompt": [{"role": "user", "content": f"What is {i} + {i % 7}?"}],
                   "solution": str(i + i % 7)}
            f.write(json.dumps(row) + "\n")
    return path


def make_cfg(*, vllm_urls, model_dir, dataset_file, trainer_port, reward_port, **over) -> AgrpoConfig:
    rollout = {"port": 0, "metrics_port": None, "heartbeat_interval_s": 0.5, "trainer_reconnect_s": 0.2,
               "server_backoff_s": 0.5, "server_backoff_max_s": 2.0, "reissue_delay_s": 0.5,
               "scoring_deadline_s": 20.0, **over.pop("rollout", {})}
    raw = {
        "model": str(model_dir), "vllm_server_base_urls": list(vllm_urls),
        "dataset": {"path": "json", "data_files": str(dataset_file)},
        "num_generations": 4, "max_completion_length": 12, "temperature": 1.0,
        "max_staleness": 2, "queue_maxsize": 64, "per_device_train_batch_size": 8,
        "num_train_epochs": 1, "vllm_server_timeout": 60, "request_timeout": 60,
        "trainer": {"port": trainer_port, "metrics_port": None},
        "reward": {"port": reward_port, "metrics_port": None, "num_workers": 1},
        "reward_funcs": [{"name": "rollout_test_rewards:distinct_tokens_reward"},
                         {"name": "rollout_test_rewards:solution_seen_reward", "weight": 0.5}],
        "rollout": rollout,
    }
    raw.update(over)
    return AgrpoConfig.model_validate(raw)


@contextlib.asynccontextmanager
async def running_rollout(cfg):
    from agrpo.services.rollout.server import build

    svc = await build(cfg)
    await svc.start()
    try:
        yield svc
    finally:
        await svc.stop()


async def wait_for(predicate, timeout: float = 120.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(interval)
