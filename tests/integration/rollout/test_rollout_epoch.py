"""One epoch through the real rollout service: real vLLM, real reward service, fake trainer.

Checks that every prompt of the epoch arrives exactly once as one group of
num_generations samples, that advantages follow (r - mean) / (std + 1e-8), that
token ids, masks and behaviour logprobs are right (logprobs recomputed with the
HF model), and that status/health/metrics answer.
"""

from __future__ import annotations

import math
import urllib.request
from collections import defaultdict

import grpc
import pytest

from agrpo.v1 import common_pb2
from agrpo.v1 import rollout_service_pb2_grpc as rollout_grpc
from rollout_helpers import NUM_PROMPTS, make_cfg, running_rollout, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
G = 4


def _hf_logprobs(model_dir, input_ids: list[int], prompt_len: int, temperature: float) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="float32").eval()
    ids = torch.tensor([input_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1] / temperature
    lp = torch.log_softmax(logits.float(), dim=-1)
    targets = ids[0, 1:]
    picked = lp.gather(1, targets[:, None])[:, 0]
    return picked[prompt_len - 1:].tolist()


async def test_epoch_delivered_once_with_groups_advantages_and_logprobs(
        vllm_server, tiny_model_dir, dataset_file, reward_port, trainer):
    cfg = make_cfg(vllm_urls=[vllm_server.base_url], model_dir=tiny_model_dir, dataset_file=dataset_file,
                   trainer_port=trainer.port, reward_port=reward_port, num_generations=G,
                   rollout={"metrics_port": 0})
    async with running_rollout(cfg) as svc:
        await wait_for(lambda: len(trainer.trained_keys) >= NUM_PROMPTS, what="one epoch trained")
        await wait_for(lambda: svc.app.scheduler.exhausted(), what="rollout idle after the epoch")
        async with grpc.aio.insecure_channel(f"localhost:{svc.port}") as ch:
            status = await rollout_grpc.RolloutServiceStub(ch).GetStatus(common_pb2.GetStatusRequest())
        with urllib.request.urlopen(f"http://127.0.0.1:{svc.metrics_port}/metrics", timeout=10) as r:
            metrics = r.read().decode()

    # Exactly once: every prompt of epoch 0, one group of G samples each, nothing more.
    assert trainer.hellos[0].prompts_per_epoch == NUM_PROMPTS
    assert sorted(trainer.trained_keys) == [(i, 0) for i in range(NUM_PROMPTS)]
    assert all(n == G for n in trainer.trained_keys.values())
    assert len(trainer.trained) == NUM_PROMPTS * G
    groups = defaultdict(list)
    for s in trainer.trained:
        groups[s.group_id].append(s)
    assert len(groups) == NUM_PROMPTS
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for samples in groups.values():
        assert sorted(s.generation_index for s in samples) == list(range(G))
        assert len({(s.prompt_key.dataset_index, s.prompt_key.epoch) for s in samples}) == 1
        # Advantages: (r - mean) / (std + 1e-8), population std, rewards = 1*distinct + 0.5*seen.
        rewards = [s.reward for s in samples]
        for s in samples:
            distinct = len(set(s.input_ids[s.prompt_length:]))
            assert s.reward_components["distinct_tokens_reward"] == distinct
            assert s.reward_components["solution_seen_reward"] == 1.0
            assert s.reward == pytest.approx(distinct + 0.5)
        mean = sum(rewards) / G
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / G)
        for s in samples:
            assert s.advantage == pytest.approx((s.reward - mean) / (std + 1e-8), abs=1e-5)
            assert s.metrics["reward_std"] == pytest.approx(std, abs=1e-6)
        # Token layout: chat-templated prompt, then the completion; mask and logprobs aligned.
        s = samples[0]
        idx = s.prompt_key.dataset_index
        expected_prompt = tok.apply_chat_template(
            [{"role": "user", "content": f"What is {idx} + {idx % 7}?"}], add_generation_prompt=True,
            tokenize=False)
        assert s.input_ids[:s.prompt_length] == tok(expected_prompt, add_special_tokens=False)["input_ids"]
        for x in samples:
            n = len(x.input_ids)
            assert len(x.completion_mask) == n and len(x.behavior_logprobs) == n
            assert list(x.completion_mask) == [0] * x.prompt_length + [1] * (n - x.prompt_length)
            assert 0 < n - x.prompt_length <= cfg.max_completion_length
            assert all(lp <= 0 and math.isfinite(lp) for lp in x.behavior_logprobs[x.prompt_length:])
            if x.version_spans:
                assert x.version_spans[0].start == x.prompt_length and x.version_spans[-1].end == n

    # Status over gRPC.
    r = status.rollout
    assert status.service.service == "rollout"
    assert r.samples_sent >= NUM_PROMPTS * G and r.prompts_issued >= NUM_PROMPTS
    assert r.servers[0].base_url == vllm_server.base_url and r.servers[0].up

    # Prometheus metrics.
    tokens = sum(len(x.input_ids) - x.prompt_length for x in trainer.trained)
    assert f"agrpo_rollout_generated_tokens_total {float(tokens)}" in metrics
    for name in ("agrpo_rollout_inflight_requests", "agrpo_rollout_buffered_samples",
                 "agrpo_rollout_vllm_request_seconds_count", "agrpo_rollout_reward_mean",
                 "agrpo_rollout_sample_staleness_versions", "agrpo_rollout_drops_total",
                 "agrpo_rollout_reissued_prompts_total", "agrpo_rollout_generation_tokens_per_second"):
        assert name in metrics, name

    # Behaviour logprobs equal the HF model's log_softmax(logits / T) for a few samples,
    # when the shared server still serves the original weights (other tests may push weights).
    label = vllm_server.get_json("/weight_info")["weight_version"]
    if label != "default":
        pytest.skip(f"shared vLLM server serves weights {label!r}, not the seed-0 model")
    for s in list(trainer.trained)[:3]:
        hf = _hf_logprobs(tiny_model_dir, list(s.input_ids), s.prompt_length, cfg.temperature)
        got = list(s.behavior_logprobs[s.prompt_length:])
        assert max(abs(a - b) for a, b in zip(hf, got)) < 1e-3
