"""Engine logic with fake balancer, scorer and sender (unit level)."""

import asyncio

import pytest

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.preflight import StartupError
from agrpo.services.rollout.balancer import GenerationFailed
from agrpo.services.rollout.data import Prompt, PromptSet
from agrpo.services.rollout.engine import Engine
from agrpo.services.rollout.metrics import RolloutMetrics
from agrpo.services.rollout.schedule import PromptScheduler
from agrpo.services.rollout.scoring import GroupScores
from agrpo.services.rollout.vllm_client import Completion, VLLMIncompatible
from rollout_fakes import FakeSender


class FakeBalancer:
    def __init__(self, spans=(), fail_prompts=(), block=None, refuse_prompts=()):
        self.spans = list(spans)
        self.fail_prompts = set(fail_prompts)
        self.refuse_prompts = set(refuse_prompts)  # refused by vLLM every time (400)
        self.block = block
        self.active = 0
        self.peak = 0
        self.aborted = []
        self.requests = []

    async def generate(self, prompt_ids, sampling, request_id, cache_salt=None, adapter=""):
        return (await self.generate_all(prompt_ids, sampling, request_id, cache_salt))[0]

    async def generate_all(self, prompt_ids, sampling, request_id, cache_salt=None, adapter=""):
        self.requests.append(request_id)
        self.active += sampling.n
        self.peak = max(self.peak, self.active)
        try:
            if self.block is not None:
                await self.block.wait()
            await asyncio.sleep(0.001)
            if prompt_ids[0] in self.refuse_prompts:
                raise GenerationFailed("400: prompt longer than max_model_len", refused=True)
            if prompt_ids[0] in self.fail_prompts:
                self.fail_prompts.discard(prompt_ids[0])
                raise GenerationFailed("boom")
            return [Completion([7, 8], [-0.1, -0.2], "stop", spans=self.spans, latency_s=0.01)
                    for _ in range(sampling.n)]
        finally:
            self.active -= sampling.n

    async def abort(self, ids):
        self.aborted.extend(ids)


class FakeScorer:
    async def score(self, request):
        n = len(request.items)
        return GroupScores([float(i) for i in range(n)], {"f": [float(i) for i in range(n)]})


class Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def make(n_prompts=4, G=2, balancer=None, **over):
    cfg = AgrpoConfig.model_validate({"num_generations": G, "max_staleness": 1, "max_completion_length": 4,
                                      "max_inflight_tasks": over.pop("inflight", 4), **over})
    prompts = PromptSet([Prompt(i, f"p{i}", [100 + i], f"p{i}") for i in range(n_prompts)], 0, n_prompts, 0)
    sched = PromptScheduler(lambda e: list(range(n_prompts)), 1)
    sender = FakeSender()
    eng = Engine(cfg, prompts=prompts, tokenizer=Tok(), scheduler=sched, balancer=balancer or FakeBalancer(),
                 scorer=FakeScorer(), sender=sender, metrics=RolloutMetrics(), producer_id="p")
    return eng, sched, sender


async def run_until(eng, pred, timeout=5.0):
    task = asyncio.create_task(eng.run())
    try:
        for _ in range(int(timeout / 0.01)):
            if pred():
                break
            await asyncio.sleep(0.01)
        assert pred()
    finally:
        eng.stop()
        await task


async def test_groups_become_samples_with_layout_and_advantages():
    eng, _sched, sender = make()
    await run_until(eng, lambda: len(sender.groups) == 4)
    key, version, samples = sender.groups[0]
    assert version == 0 and len(samples) == 2
    s = samples[1]
    assert list(s.input_ids) == [100 + key[0], 7, 8] and list(s.completion_mask) == [0, 1, 1]
    assert list(s.behavior_logprobs) == pytest.approx([0.0, -0.1, -0.2]) and s.prompt_length == 1
    assert [x.advantage for x in samples] == pytest.approx([-1.0, 1.0], abs=1e-6)
    assert s.reward_components["f"] == 1.0 and s.metrics["rewards/f"] == 1.0


async def test_inflight_limit_is_respected():
    bal = FakeBalancer()
    eng, _, sender = make(n_prompts=10, G=2, balancer=bal, inflight=4)
    await run_until(eng, lambda: len(sender.groups) == 10)
    assert bal.peak <= 4


async def test_every_request_slot_is_used_when_groups_do_not_divide_it():
    # 6 slots, groups of 4: a group no longer waits for 4 free slots (which left 2 idle);
    # its requests take slots as they free, as TRL's per-request slots do
    bal = FakeBalancer()
    eng, _, sender = make(n_prompts=12, G=4, balancer=bal, inflight=6)
    await run_until(eng, lambda: len(sender.groups) == 12)
    assert bal.peak == 6
    assert eng.inflight_requests == 0


async def test_one_request_per_group_asks_for_all_g_and_starts_only_with_g_free_slots():
    bal = FakeBalancer()
    eng, _, sender = make(n_prompts=12, G=4, balancer=bal, inflight=6,
                          rollout={"one_request_per_group": True})
    await run_until(eng, lambda: len(sender.groups) == 12)
    assert len(bal.requests) == 12 and all(r.endswith("-0") for r in bal.requests)
    assert bal.peak == 4  # 6 slots hold one group of 4 at a time, never 8
    assert all(len(samples) == 4 for _, _, samples in sender.groups)
    assert eng.inflight_requests == 0


async def test_a_server_that_answers_part_of_a_group_stops_the_run_with_the_reason():
    bal = FakeBalancer()

    async def partial(*_args, **_kw):
        raise VLLMIncompatible("vLLM at u answered 5 of the 8 completions asked for in one request")

    bal.generate_all = partial
    eng, _, _ = make(balancer=bal, rollout={"one_request_per_group": True})
    with pytest.raises(StartupError, match="answered 5 of the 8"):
        await asyncio.wait_for(eng.run(), 10)


async def test_a_group_in_one_request_is_aborted_by_its_request_id():
    block = asyncio.Event()
    bal = FakeBalancer(block=block)
    eng, _, _ = make(n_prompts=1, G=2, balancer=bal, rollout={"one_request_per_group": True})
    task = asyncio.create_task(eng.run())
    for _ in range(100):
        if bal.requests:
            break
        await asyncio.sleep(0.01)
    eng.on_version(2)
    await asyncio.sleep(0.05)
    assert bal.requests[0] in bal.aborted and eng.drops == {"stale_inflight": 1}
    eng.stop()
    block.set()
    await task


async def test_failed_generation_reissues_the_prompt():
    eng, sched, sender = make(balancer=FakeBalancer(fail_prompts={101}))
    await run_until(eng, lambda: len(sender.groups) == 4)
    assert eng.drops == {"generation_failed": 1} and sched.reissued == 1
    assert sorted(k for k, _, _ in sender.groups) == [(i, 0) for i in range(4)]


async def test_a_prompt_vllm_always_refuses_stops_the_run_with_the_reason():
    eng, _sched, _sender = make(balancer=FakeBalancer(refuse_prompts={102}))
    with pytest.raises(StartupError, match=r"vLLM refused prompt 2 \(epoch 0\) 3 times: 400: prompt longer"):
        await asyncio.wait_for(eng.run(), 10)
    assert eng.drops["generation_failed"] == 2  # re-issued twice, then the run stops


async def test_version_bump_aborts_stale_inflight_groups_and_reissues():
    block = asyncio.Event()
    bal = FakeBalancer(block=block)
    eng, _sched, sender = make(n_prompts=2, G=2, balancer=bal)
    task = asyncio.create_task(eng.run())
    for _ in range(100):
        if len(eng.generating) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(eng.generating) == 2
    eng.on_version(2)  # max_staleness 1: both groups dispatched at 0 are now too stale
    assert eng.drops == {"stale_inflight": 2}
    await asyncio.sleep(0.05)
    assert len(bal.aborted) == 4
    block.set()
    for _ in range(200):
        if len(sender.groups) == 2:
            break
        await asyncio.sleep(0.01)
    eng.stop()
    await task
    assert sorted(k for k, _, _ in sender.groups) == [(0, 0), (1, 0)]
    assert {v for _, v, _ in sender.groups} == {2}  # re-issued under the new version


async def test_tag_is_the_oldest_span_version():
    eng, _, sender = make(n_prompts=1, balancer=FakeBalancer(spans=[("3", 0, 1), ("4", 1, 2)]), max_staleness=4)
    eng.version = 4
    await run_until(eng, lambda: len(sender.groups) == 1)
    _, version, samples = sender.groups[0]
    assert version == 3
    assert [(v.policy_version, v.start, v.end) for v in samples[0].version_spans] == [(3, 1, 2), (4, 2, 3)]



def test_requests_name_the_newest_adapter_the_servers_hold():
    """The trainer mints a version before its adapter is in vLLM: a request must not fall back to
    the base model (no adapter) in between, nor go back to an older adapter heard of late."""
    eng, _, _ = make()
    eng.on_version(2, "agrpo-v2")
    eng.on_version(3)  # a version minted, its adapter not loaded yet
    assert (eng.version, eng.adapter) == (3, "agrpo-v2")
    eng.on_version(4, "agrpo-v3")  # a PushSamples answer: version 4 minted, agrpo-v3 served
    assert (eng.version, eng.adapter) == (4, "agrpo-v3")
    eng.on_version(3, "agrpo-v2")  # late
    assert (eng.version, eng.adapter) == (4, "agrpo-v3")
