"""The engine's multi-turn path with a scripted balancer, the tiny tokenizer and fakes
for scorer and sender: env reward merged into the total, tool metrics, rows -> samples."""

import asyncio

import pytest

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.rollout.data import Prompt, PromptSet
from agrpo.services.rollout.engine import Engine
from agrpo.services.rollout.metrics import RolloutMetrics
from agrpo.services.rollout.schedule import PromptScheduler
from agrpo.services.rollout.scoring import GroupScores
from agrpo.services.rollout.vllm_client import Completion
from rollout_fakes import FakeSender

CALL = '<tool_call>\n{"name": "increment", "arguments": {"by": 3}}\n</tool_call>'


class ScriptedBalancer:
    def __init__(self, tok):
        self.tok = tok
        self.requests = []

    async def generate(self, prompt_ids, sampling, request_id, cache_salt=None, adapter=""):
        self.requests.append((request_id, sampling.max_tokens))
        text = CALL if request_id.endswith("-t0") else "Done."
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return Completion(ids, [-0.25] * len(ids), "stop", [("3", 0, len(ids))])

    async def abort(self, ids):
        pass

    servers = []


class FakeScorer:
    def __init__(self):
        self.requests = []

    async def score(self, request):
        self.requests.append(request)
        n = len(request.items)
        return GroupScores([1.0] * n, {"f": [1.0] * n})


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


async def run_engine(tok, **over):
    cfg = AgrpoConfig.model_validate({
        "num_generations": 2, "max_completion_length": 64, "max_inflight_tasks": 2,
        "environment_factory": "mt_tools:CounterEnv", "tools": ["mt_tools:lookup"],
        "dataset": {"path": "json"}, "reward_funcs": [{"name": "x:y"}], **over})
    msgs = [{"role": "user", "content": "count"}]
    prompts = PromptSet([Prompt(0, msgs, [1], "count", {"start": 1})], 0, 1, 0)
    sender, scorer, bal = FakeSender(), FakeScorer(), ScriptedBalancer(tok)
    eng = Engine(cfg, prompts=prompts, tokenizer=tok, scheduler=PromptScheduler(lambda e: [0], 1),
                 balancer=bal, scorer=scorer, sender=sender, metrics=RolloutMetrics(), producer_id="p")
    task = asyncio.create_task(eng.run())
    for _ in range(500):
        if sender.groups:
            break
        await asyncio.sleep(0.01)
    eng.stop()
    await task
    assert sender.groups, "no group produced"
    return eng, sender, scorer, bal


async def test_environment_alone_gives_the_reward_without_reward_funcs(tok):
    _eng, sender, scorer, _ = await run_engine(tok, reward_funcs=[])
    assert scorer.requests == []                            # no reward service call
    s = sender.groups[0][2][0]
    assert s.reward == 3.0 and s.reward_components["CounterEnv"] == 3.0


async def test_engine_runs_conversations_and_merges_env_reward(tok):
    eng, sender, scorer, bal = await run_engine(tok)
    _key, version, samples = sender.groups[0]
    assert version == 3 and len(samples) == 2           # tagged by the spans' version
    s = samples[0]
    assert s.reward == pytest.approx(1.0 + 3.0)          # reward service + CounterEnv.get_reward
    assert s.reward_components["CounterEnv"] == 3.0 and s.metrics["tools/call_frequency"] == 1.0
    assert s.metrics["tools/failure_frequency"] == 0.0
    assert [v.policy_version for v in s.version_spans] == [3] * len(s.version_spans)
    assert len(s.input_ids) == len(s.completion_mask) == len(s.behavior_logprobs)
    assert 0 < s.prompt_length < len(s.input_ids) and s.completion_mask[s.prompt_length] == 1
    text = tok.decode(list(s.input_ids))
    assert "(start at 1)" in text and "<tool_response>\n3\n</tool_response>" in text
    assert '"name": "increment"' in text and '"name": "lookup"' in text   # both tool sets shown
    # the budget is shared over turns
    n_call = len(tok(CALL, add_special_tokens=False)["input_ids"]) + 1
    assert sorted(mt for _, mt in bal.requests) == [64 - n_call] * 2 + [64] * 2
    comp = scorer.requests[0].items[0].completion.messages.messages
    assert [m.role for m in comp] == ["assistant", "tool", "assistant"]
    assert eng.strategy.stats["tool_calls"] == 2
