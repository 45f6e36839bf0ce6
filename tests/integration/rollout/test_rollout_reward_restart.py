"""Scoring survives a restart of the real reward service: groups that could not be
scored are re-issued, and every prompt of the epoch still trains exactly once."""

from __future__ import annotations

import asyncio

import pytest

from agrpo.services.common.config import AgrpoConfig
from fake_trainer import FakeTrainer
from rollout_helpers import make_cfg, running_rollout, wait_for, write_dataset
from vllm_server import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
G = 4
N = 24


async def _start_reward(port: int):
    from agrpo.services.reward.server import build

    cfg = AgrpoConfig.model_validate({
        "reward": {"port": port, "metrics_port": None, "num_workers": 1},
        "reward_funcs": [{"name": "rollout_test_rewards:distinct_tokens_reward"}]})
    server = await build(cfg)
    await server.start()
    return server


async def test_scoring_survives_reward_service_restart(vllm_server, tiny_model_dir, tmp_path):
    port = free_port()
    reward = await _start_reward(port)
    # A slow consumer and a small rollout buffer pace generation, so the outage hits mid-epoch.
    trainer = FakeTrainer(queue_maxsize=8, max_staleness=2, train_delay_s=0.05)
    await trainer.start()
    cfg = make_cfg(vllm_urls=[vllm_server.base_url], model_dir=tiny_model_dir,
                   dataset_file=write_dataset(tmp_path / "d.jsonl", N), trainer_port=trainer.port,
                   reward_port=port, num_generations=G, queue_maxsize=16,
                   rollout={"scoring_retries": 1, "scoring_deadline_s": 5.0})
    try:
        async with running_rollout(cfg) as svc:
            await wait_for(lambda: len(trainer.trained_keys) >= 2, what="first groups trained")
            await reward.stop(0)
            reward = None
            await wait_for(lambda: svc.app.engine.drops.get("scoring_failed", 0) >= 1, timeout=60,
                           what="a group failing to score while the reward service is down")
            trained_during_outage = len(trainer.trained_keys)
            await asyncio.sleep(1.0)
            reward = await _start_reward(port)
            await wait_for(lambda: len(trainer.trained_keys) == N, timeout=240, what="epoch trained")
            await wait_for(lambda: svc.app.scheduler.exhausted(), what="rollout idle")
    finally:
        await trainer.stop()
        if reward is not None:
            await reward.stop(0)
    assert trained_during_outage < N
    assert sorted(trainer.trained_keys) == [(i, 0) for i in range(N)]
    assert all(n == G for n in trainer.trained_keys.values())
