"""Fixtures for rollout integration tests: data, a real reward service, a fake trainer
(helpers live in tests/support/rollout_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agrpo.services.common.config import AgrpoConfig
from fake_trainer import FakeTrainer
from rollout_helpers import write_dataset


@pytest.fixture
def dataset_file(tmp_path) -> Path:
    return write_dataset(tmp_path / "prompts.jsonl")


@pytest.fixture
async def reward_port():
    from agrpo.services.reward.server import build

    cfg = AgrpoConfig.model_validate({
        "reward": {"port": 0, "metrics_port": None, "num_workers": 1},
        "reward_funcs": [{"name": "rollout_test_rewards:distinct_tokens_reward"},
                         {"name": "rollout_test_rewards:solution_seen_reward", "weight": 0.5}]})
    server = await build(cfg)
    port = await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


@pytest.fixture
async def trainer():
    t = FakeTrainer(queue_maxsize=64, max_staleness=2)
    await t.start()
    try:
        yield t
    finally:
        await t.stop()
