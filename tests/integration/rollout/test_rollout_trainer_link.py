"""The trainer side of the rollout service: a trainer restart loses nothing (held samples
are re-sent, prompts it lost are re-issued), and a silent trainer shows in health and status."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fake_trainer import FakeTrainer
from rollout_helpers import make_cfg, running_rollout, wait_for, write_dataset

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
G = 4
N = 16


async def test_trainer_restart_loses_nothing(vllm_server, tiny_model_dir, tmp_path, reward_port):
    first = FakeTrainer(queue_maxsize=8, max_staleness=2, train_delay_s=0.05)
    port = await first.start()
    cfg = make_cfg(vllm_urls=[vllm_server.base_url], model_dir=tiny_model_dir,
                   dataset_file=write_dataset(tmp_path / "d.jsonl", N), trainer_port=port,
                   reward_port=reward_port, num_generations=G, queue_maxsize=16)
    second = FakeTrainer(queue_maxsize=8, max_staleness=2, port=port)
    try:
        async with running_rollout(cfg) as svc:
            await wait_for(lambda: len(first.trained_keys) >= 2, what="some prompts trained")
            await first.stop()  # a crash without a checkpoint: its ledger and buffer are gone
            lost_by_first = len(first.trained_keys)
            assert lost_by_first < N
            await second.start()
            await wait_for(lambda: len(second.trained_keys) == N, timeout=240, what="epoch on the new trainer")
            await wait_for(lambda: svc.app.scheduler.exhausted(), what="rollout idle")
            assert svc.app.sender.held == 0
    finally:
        await second.stop()
    assert len(second.hellos) == 1
    assert sorted(second.trained_keys) == [(i, 0) for i in range(N)]
    assert all(n == G for n in second.trained_keys.values())


async def test_silent_trainer_is_reported_in_health_and_status(vllm_server, tiny_model_dir, dataset_file,
                                                               reward_port, trainer):
    cfg = make_cfg(vllm_urls=[vllm_server.base_url], model_dir=tiny_model_dir, dataset_file=dataset_file,
                   trainer_port=trainer.port, reward_port=reward_port, heartbeat_stale_after_s=1.5)
    async with running_rollout(cfg) as svc, grpc.aio.insecure_channel(f"localhost:{svc.port}") as ch:
        health = health_pb2_grpc.HealthStub(ch)
        req = health_pb2.HealthCheckRequest(service="agrpo.v1.RolloutService")
        assert (await health.Check(req)).status == health_pb2.HealthCheckResponse.SERVING
        await trainer.stop()
        await wait_for(lambda: svc.app.liveness.stale, timeout=30, what="trainer reported silent")
        for _ in range(50):
            if (await health.Check(req)).status == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
            await asyncio.sleep(0.2)
        assert (await health.Check(req)).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert svc.app.status()["trainer_silent_s"] > 1.5
        assert not svc.app.status()["trainer_connected"]
