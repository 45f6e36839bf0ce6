"""Staleness and backpressure through the real rollout service (real vLLM and reward service).

- A policy bump past max_staleness gets the old groups dropped (by the trainer at
  consumption) and their prompts re-issued: every prompt still trains exactly once.
- When the trainer stops reading, nothing grows without bound: the trainer gets
  no more than its credits, rollout holds no more than queue_maxsize samples and
  stops issuing; when reading resumes, the epoch completes exactly once.
"""

from __future__ import annotations

import asyncio

import pytest

from fake_trainer import FakeTrainer
from rollout_helpers import NUM_PROMPTS, make_cfg, running_rollout, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
G = 4


def _exactly_once(trainer) -> None:
    assert sorted(trainer.trained_keys) == [(i, 0) for i in range(NUM_PROMPTS)]
    assert all(n == G for n in trainer.trained_keys.values())


async def test_version_bump_drops_old_groups_and_reissues_their_prompts(
        vllm_server, tiny_model_dir, dataset_file, reward_port, trainer):
    # Tag by dispatch version (no vLLM spans), so the shared server's weight label does not matter.
    cfg = make_cfg(vllm_urls=[vllm_server.base_url], model_dir=tiny_model_dir, dataset_file=dataset_file,
                   trainer_port=trainer.port, reward_port=reward_port, num_generations=G,
                   rollout={"generate_endpoint": "completions"})
    trainer.stop_reading()
    async with running_rollout(cfg) as svc:
        await wait_for(lambda: len(trainer.received) == NUM_PROMPTS * G, what="all groups at the trainer")
        assert {s.policy_version for s in trainer.received} == {0}
        trainer.publish(cfg.max_staleness + 1)
        await wait_for(lambda: svc.app.engine.version == cfg.max_staleness + 1, what="rollout sees v3")
        trainer.resume_reading()
        await wait_for(lambda: len(trainer.trained_keys) == NUM_PROMPTS, what="epoch re-trained")
        await wait_for(lambda: svc.app.scheduler.exhausted(), what="rollout idle")
        drops = dict(svc.app.engine.drops)
        reissued = svc.app.scheduler.reissued
    assert len(trainer.dropped_stale) == NUM_PROMPTS * G
    assert drops.get("stale_trainer") == NUM_PROMPTS
    assert reissued == NUM_PROMPTS
    assert {s.policy_version for s in trainer.trained} == {cfg.max_staleness + 1}
    _exactly_once(trainer)


async def test_buffers_stay_bounded_when_the_trainer_stops_reading(
        vllm_server, tiny_model_dir, dataset_file, reward_port):
    trainer = FakeTrainer(queue_maxsize=8, max_staleness=2)
    await trainer.start()
    trainer.stop_reading()
    limit = 16
    cfg = make_cfg(vllm_urls=[vllm_server.base_url], model_dir=tiny_model_dir, dataset_file=dataset_file,
                   trainer_port=trainer.port, reward_port=reward_port, num_generations=G,
                   queue_maxsize=limit)
    try:
        async with running_rollout(cfg) as svc:
            app = svc.app
            # Generation is paced by the trainer's credits (8 here), not by rollout's own buffer.
            await wait_for(lambda: app.sender.held >= trainer.capacity, what="rollout buffer filling")
            issued = app.scheduler.issued
            peak = 0
            for _ in range(30):  # 3 s of a stopped trainer: nothing more may be issued
                peak = max(peak, app.sender.held + app.engine.pipeline_samples)
                await asyncio.sleep(0.1)
            assert app.scheduler.issued == issued
            assert peak <= trainer.capacity <= limit
            assert len(trainer.received) == 8 and trainer.max_buffered == 8
            trainer.resume_reading()
            await wait_for(lambda: len(trainer.trained_keys) == NUM_PROMPTS, what="epoch trained")
            assert app.sender.held + app.engine.pipeline_samples <= limit
    finally:
        await trainer.stop()
    _exactly_once(trainer)
    assert len(trainer.trained) == NUM_PROMPTS * G
