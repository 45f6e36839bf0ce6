"""The trainer service end to end: real gRPC over a socket, real vLLM (session server)."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agrpo.services.trainer.app import build_pace
from agrpo.services.trainer.sample import Outcome
from agrpo.services.trainer.server import build
from agrpo.v1 import trainer_service_pb2 as trainer_pb
from agrpo.v1 import trainer_service_pb2_grpc as trainer_grpc
from agrpo.v1.common_pb2 import GetStatusRequest, HeartbeatRequest
from agrpo.v1.trainer_service_pb2 import WatchPolicyRequest
from trainer_helpers import Producer, greedy, make_cfg, rollout_samples, vllm_greedy

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


async def _health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="agrpo.v1.TrainerService"), timeout=10)
        return resp.status


async def _next_version(stream, at_least: int, timeout: float = 120.0) -> int:
    while True:
        msg = await asyncio.wait_for(stream.read(), timeout)
        if msg.policy.version >= at_least:
            return msg.policy


async def test_train_sync_publish_stale_and_duplicates(shared_vllm, tiny_model_dir, tmp_path):
    cfg = make_cfg(tiny_model_dir, tmp_path, [shared_vllm.base_url], max_staleness=0)
    svc = await build(cfg)
    await svc.start(wait_ready=False)
    try:
        assert await _health(svc.port) == health_pb2.HealthCheckResponse.NOT_SERVING
        await svc.wait_ready(timeout=300)
        assert await _health(svc.port) == health_pb2.HealthCheckResponse.SERVING
        assert shared_vllm.get_json("/weight_info")["weight_version"] == "1"  # cold sync = version 1

        channel = grpc.aio.insecure_channel(f"127.0.0.1:{svc.port}")
        stub = trainer_grpc.TrainerServiceStub(channel)
        watch = stub.WatchPolicy(WatchPolicyRequest(watcher_id="test"))
        first = (await asyncio.wait_for(watch.read(), 30)).policy
        assert first.version == 1 and list(first.synced_servers) == [shared_vllm.base_url]

        producer = Producer(svc.port, prompts_per_epoch=10)
        await producer.wait_for(lambda: producer.first is not None)
        assert producer.first.credits == build_pace(cfg).window and producer.first.policy_version == 1
        stale = rollout_samples(1, 1, version=0, prefix="stale")  # 1 - 0 > max_staleness 0
        fresh = rollout_samples(1, 4, version=1, seed=1)
        await producer.send(stale + fresh)
        await producer.wait_for(lambda: all(producer.final(s.sample_id) == Outcome.TRAINED for s in fresh))
        assert producer.final(stale[0].sample_id) == Outcome.DROPPED_STALE
        assert "max_staleness" in producer.reasons[stale[0].sample_id]
        await producer.send(fresh[:1])  # a re-send of a trained id
        await producer.wait_for(lambda: producer.final(fresh[0].sample_id) == Outcome.DUPLICATE)

        published = await _next_version(watch, 2)
        assert published.step == 1
        await svc.wait_done(timeout=120)
        status = (await stub.GetStatus(GetStatusRequest(), timeout=10)).trainer
        assert (status.step, status.policy_version, status.samples_trained) == (1, 2, 4)
        assert status.samples_dropped["stale"] == 1 and status.samples_dropped["duplicate"] == 1
        assert status.samples_received == 6 and status.prompts_trained == 1
        await producer.wait_for(lambda: producer.done)
        beat = await stub.Heartbeat(HeartbeatRequest(), timeout=10)
        assert beat.policy_version == 2 and beat.receiver.service == "trainer"

        # vLLM now serves exactly the trainer's weights (version 2).
        assert shared_vllm.get_json("/weight_info")["weight_version"] == "2"
        model = svc.app.loop.engine.model
        for prompt in ([5, 17, 99, 42], list(fresh[0].input_ids[:8])):
            assert vllm_greedy(shared_vllm, prompt) == greedy(model, prompt)

        lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert lines[0]["step"] == 1 and lines[0]["sample/dropped_stale_total"] == 1
        for key in ("loss", "ratio", "kl", "entropy", "clip_ratio/low_mean", "completions/mean_length",
                    "batch/forward_tokens", "perf/tokens_per_s", "perf/weight_sync_s",
                    "perf/weight_sync/update_s"):
            assert key in lines[0], key
        text = svc.app.metrics.registry_owner.registry.get_sample_value(
            "agrpo_trainer_samples_dropped_total", {"reason": "stale"})
        assert text == 1.0
        watch.cancel()
        await producer.close()
        await channel.close()
    finally:
        await svc.stop()


async def test_checkpoint_resume_keeps_step_version_ledger(shared_vllm, tiny_model_dir, tmp_path):
    cfg = make_cfg(tiny_model_dir, tmp_path, [shared_vllm.base_url], save_strategy="steps", save_steps=1,
                   save_total_limit=1)
    samples = rollout_samples(2, 2, version=1, seed=2)
    svc = await build(cfg)
    await svc.start()
    try:
        producer = Producer(svc.port, prompts_per_epoch=4)
        await producer.send(samples)
        await producer.wait_for(lambda: all(producer.final(s.sample_id) == Outcome.TRAINED for s in samples))
        await svc.wait_done(timeout=120)
        await producer.close()
        saved = (svc.app.state.step, svc.app.state.version, sorted(svc.app.state.ledger.trained_ids))
    finally:
        await svc.stop()
    assert saved[:2] == (1, 2)
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-1"]

    resumed = await build(make_cfg(tiny_model_dir, tmp_path, [shared_vllm.base_url], max_steps=2,
                                   resume_from_checkpoint=True))
    await resumed.start()
    try:
        # Same weights as version 2 were checkpointed, so the cold sync re-labels them as 2.
        assert (resumed.app.state.step, resumed.app.state.version) == (1, 2)
        assert sorted(resumed.app.state.ledger.trained_ids) == saved[2]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{resumed.port}") as ch:
            point = (await trainer_grpc.TrainerServiceStub(ch).GetResumePoint(
                trainer_pb.GetResumePointRequest(), timeout=10)).resume_point
        assert point.step == 1 and point.policy_version == 2
        assert sorted((k.dataset_index, k.epoch) for k in point.trained) == [(0, 0), (1, 0)]
        producer = Producer(resumed.port, producer_id="producer-2")
        await producer.send(samples[:1])
        await producer.wait_for(lambda: producer.final(samples[0].sample_id) is not None)
        assert producer.final(samples[0].sample_id) == Outcome.DUPLICATE
        assert "trained" in producer.reasons[samples[0].sample_id]
        await producer.close()
    finally:
        await resumed.stop()
