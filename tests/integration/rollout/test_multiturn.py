"""Multi-turn rollouts against the real vLLM session server with the tiny model.

The random tiny model practically never writes a valid tool call, so tool turns are
FORCED: on the first turn the test appends the tokens of a complete tool call to the
prompt and lets vLLM sample a few more tokens after it. The forced tokens are kept in
the row as context (mask 0); only what vLLM sampled is trained. Everything after the
first turn (tool execution, re-rendering, reconciliation, the next vLLM turns,
environment rewards) is the real code path. The service-level tests (environments,
dict of environments) run the whole rollout service without forcing: there the
model does not call tools, and the environment reward and per-env tool prompts are
what is checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import aiohttp
import pytest

import mt_tools as T
from agrpo.services.common.versions import label_to_version
from agrpo.services.rollout.multiturn.conversation import TurnLimits, run_conversation
from agrpo.services.rollout.multiturn.tools import load_tools, tool_schema
from agrpo.services.rollout.vllm_client import Completion, SamplingConfig, VLLMClient
from rollout_helpers import make_cfg, running_rollout, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
M = "mt_tools"


@dataclass
class Forced(Completion):
    output_mask: list[int] = field(default_factory=list)


def forcing(client, tok, forced_text: str, after: int = 3, temperature: float = 1.0):
    """A generate() whose first turn starts with forced_text, then `after` sampled tokens."""
    forced = tok(forced_text, add_special_tokens=False)["input_ids"]
    log = []

    async def generate(prompt_ids, max_tokens, turn):
        if turn == 0:
            n = max(1, min(after, max_tokens - len(forced)))
            out = await client.generate(prompt_ids + forced, SamplingConfig(n, temperature), f"mt-{turn}")
            spans = [(lb, s + len(forced), e + len(forced)) for lb, s, e in out.spans]
            res = Forced(forced + out.token_ids, [0.0] * len(forced) + out.logprobs, out.finish_reason,
                         spans, output_mask=[0] * len(forced) + [1] * len(out.token_ids))
        else:
            res = await client.generate(prompt_ids, SamplingConfig(max_tokens, temperature), f"mt-{turn}")
        log.append((prompt_ids, res))
        return res
    return generate, log


@pytest.fixture
async def client(vllm_server):
    async with aiohttp.ClientSession() as session:
        c = VLLMClient(vllm_server.base_url, session, request_timeout=120)
        await c.handshake(120, "0.0")
        yield c


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def call(name, **args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


async def converse(client, tok, forced, tools, *, budget=40, max_iters=1, fork_threshold=1024, timeout=1.0):
    t = load_tools([f"{M}:{n}" for n in tools])
    gen, log = forcing(client, tok, forced)
    limits = TurnLimits(budget, client.info.max_model_len, max_iters, timeout, fork_threshold)
    res = await run_conversation(gen, tok, [{"role": "user", "content": "Use the tools."}], tools=t,
                                 schemas=[tool_schema(f) for f in t.values()], limits=limits,
                                 version_of=lambda lb: label_to_version(lb, 0))
    return res, log


def trained_count(res):
    return sum(sum(r.mask) for r in res.rows)


async def test_tool_output_reaches_the_next_vllm_turn(client, tok):
    T.TABLE["x"] = "PURPLE-17"
    res, log = await converse(client, tok, call("lookup", key="x"), ["lookup"])
    assert res.tool_calls == 1 and res.tool_failures == 0
    assert res.turns == 2 and len(log) == 2
    second_prompt = tok.decode(log[1][0])
    assert "<tool_response>\nx=PURPLE-17\n</tool_response>" in second_prompt
    # budget over the conversation: turn 2 got what turn 1 left
    assert res.generated <= 40
    sampled = sum(len(c.token_ids) for _, c in log) - len(tok(call("lookup", key="x"),
                                                              add_special_tokens=False)["input_ids"])
    # every sampled token is trained once, except those a realign turned into context
    assert trained_count(res) + sum(res.tally.drift_tokens) >= sampled >= trained_count(res) > 0
    for row in res.rows:
        assert len(row.ids) == len(row.mask) == len(row.logprobs)
        assert all(lp < 0 or lp == 0.0 for lp in row.logprobs)
        assert all(lp == 0.0 for lp, m in zip(row.logprobs, row.mask) if not m)
        assert any(lp < 0 for lp, m in zip(row.logprobs, row.mask) if m)   # real vLLM logprobs
        assert row.spans() and row.oldest_version() is not None
    last = res.rows[-1]
    assert last.ids[-len(log[1][1].token_ids):] == log[1][1].token_ids


async def test_fork_threshold_zero_forks_instead_of_realigning(client, tok):
    res, log = await converse(client, tok, call("lookup", key="x"), ["lookup"], fork_threshold=0)
    if res.tally.clean == res.turns:
        pytest.skip("vLLM ended the forced turn exactly where the template does: nothing to fork")
    assert res.tally.fork == 1 and res.tally.realign == 0
    sampled = sum(len(c.token_ids) for _, c in log) - sum(1 for m in (log[0][1].output_mask) if m == 0)
    assert trained_count(res) == sampled           # nothing lost: each sampled token in exactly one row


@pytest.mark.parametrize("tool,args,ok,expect", [
    ("async_double", {"x": 21}, True, "42"),                 # async tool
    ("explode", {"x": 1}, False, "exploded on purpose"),    # raises
    ("stall", {"x": 1}, False, "timed out"),                # hangs past the per-call timeout
])
async def test_async_raising_and_hanging_tools(client, tok, tool, args, ok, expect):
    # One tool per conversation: the tiny tokenizer spends ~300 tokens on a schema (max_model_len 512).
    res, log = await converse(client, tok, call(tool, **args), [tool], timeout=0.5)
    assert res.tool_calls == 1 and res.tool_failures == (0 if ok else 1)
    content = next(m for m in res.messages if m["role"] == "tool")["content"]
    assert content == expect if ok else expect in json.loads(content)["error"]
    assert expect in tok.decode(log[1][0])    # the model sees the result or the error


async def test_environment_tool_and_reward_through_multiturn_runner(client, tok, tiny_model_dir):
    from agrpo.services.common.config import AgrpoConfig
    from agrpo.services.rollout.data import Prompt
    from agrpo.services.rollout.multiturn.runner import MultiTurn

    cfg = AgrpoConfig.model_validate({"max_completion_length": 60, "max_tool_calling_iterations": 1,
                                      "environment_factory": f"{M}:ScoreEnv", "dataset": {"path": "json"}})
    ctx = SimpleNamespace(balancer=SimpleNamespace(servers=[SimpleNamespace(client=client)]))
    mt = MultiTurn(cfg, tok, ctx)
    gen, log = forcing(client, tok, call("bump", times=2))
    prompt = Prompt(0, [{"role": "user", "content": "Play."}], [], "Play.", {"goal": 7})
    res = await mt.run(prompt, gen, lambda lb: label_to_version(lb, 0))
    assert res.env_rewards == {"ScoreEnv": 21.0}
    assert "bumped to 2" in tok.decode(log[1][0]) and "[goal 7]" in tok.decode(log[0][0])
    assert mt.envs.specs["default"].created == 1                    # pooled and reused


def _env_dataset(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


async def test_rollout_service_with_two_environments(vllm_server, tiny_model_dir, tmp_path, reward_port,
                                                      trainer):
    rows = [{"prompt": [{"role": "user", "content": f"Task {i}"}], "solution": "s", "goal": i,
             "environment": "score" if i % 2 == 0 else "shout"} for i in range(4)]
    data = _env_dataset(tmp_path / "envs.jsonl", rows)
    cfg = make_cfg(vllm_urls=[vllm_server.base_url], model_dir=tiny_model_dir, dataset_file=data,
                   trainer_port=trainer.port, reward_port=reward_port, num_generations=2,
                   max_completion_length=16, max_tool_calling_iterations=2,
                   environment_factory={"score": f"{M}:ScoreEnv", "shout": f"{M}:ShoutEnv"})
    async with running_rollout(cfg) as svc:
        await wait_for(lambda: len(trainer.trained_keys) == 4, what="4 env prompts trained")
        engine = svc.app.engine
        stats = dict(engine.strategy.stats)
    by_env = {}
    for s in trainer.received:
        env = rows[s.prompt_key.dataset_index]["environment"]
        by_env.setdefault(env, []).append(s)
        text = s.completion_text
        assert len(s.input_ids) == len(s.completion_mask) == len(s.behavior_logprobs)
        assert s.prompt_length > 0 and s.completion_mask[s.prompt_length] == 1
        # as TRL: the two tool frequencies exist together, only for a group that called a tool
        assert ("tools/call_frequency" in s.metrics) == ("tools/failure_frequency" in s.metrics)
        assert "tools/latency_ms" in s.metrics and "tools/loop_exhausted" in s.metrics
        del text
    for group in {s.group_id for s in trainer.received}:
        members = [s for s in trainer.received if s.group_id == group]
        called = any(s.metrics.get("tools/call_frequency", 0) > 0 for s in members)
        assert all(("tools/call_frequency" in s.metrics) == called for s in members), group
    assert set(by_env) == {"score", "shout"}
    for s in by_env["score"]:
        full = svc.app.tokenizer.decode(list(s.input_ids))
        assert '"name": "bump"' in full and '"name": "shout"' not in full
        assert "[goal" in full
        assert s.reward_components["ScoreEnv"] >= 1.0 and "ShoutEnv" not in s.reward_components
    for s in by_env["shout"]:
        full = svc.app.tokenizer.decode(list(s.input_ids))
        assert '"name": "shout"' in full and '"name": "bump"' not in full
        assert s.reward_components["ShoutEnv"] == 2.0
        # reward service total (distinct tokens + 0.5 * solution seen) plus the env's 2.0
        assert s.reward == pytest.approx(s.reward_components["distinct_tokens_reward"]
                                         + 0.5 * s.reward_components["solution_seen_reward"] + 2.0)
    assert stats["conversations"] >= 8


async def test_environment_without_a_dataset_writes_the_prompts(vllm_server, tiny_model_dir, tmp_path,
                                                                 reward_port, trainer):
    cfg = make_cfg(vllm_urls=[vllm_server.base_url], model_dir=tiny_model_dir, dataset_file=None,
                   trainer_port=trainer.port, reward_port=reward_port, num_generations=2,
                   max_completion_length=16, max_tool_calling_iterations=1, max_steps=3,
                   dataset={"path": None}, reward_funcs=[], environment_factory=f"{M}:PromptEnv")
    async with running_rollout(cfg) as svc:
        await wait_for(lambda: len(trainer.received) >= 8, what="env-written prompts generated")
        tokenizer = svc.app.tokenizer
    for s in trainer.received[:8]:
        text = tokenizer.decode(list(s.input_ids[:s.prompt_length]))
        assert "Task number" in text and '"name": "count"' in text
        assert s.reward_components["PromptEnv"] == 1.0 and s.reward == pytest.approx(1.0)
