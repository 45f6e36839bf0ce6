"""The conversation driver with the tiny model's real tokenizer and a scripted generator."""

import json

import pytest

import mt_tools
from agrpo.services.rollout.multiturn.conversation import TurnLimits, run_conversation
from agrpo.services.rollout.multiturn.tools import load_tools, tool_schema
from agrpo.services.rollout.vllm_client import Completion

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "x"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def scripted(tok, texts, versions=("1",)):
    """A generator returning the given texts (each + EOS), one per turn; records max_tokens."""
    calls = []

    async def generate(prompt_ids, max_tokens, turn):
        ids = tok(texts[turn], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids = ids[:max_tokens]
        calls.append((list(prompt_ids), max_tokens))
        label = versions[min(turn, len(versions) - 1)]
        return Completion(ids, [-0.5] * len(ids), "stop", [(label, 0, len(ids))])
    return generate, calls


def limits(**kw):
    base = dict(budget=200, max_model_len=4096, max_iters=None, tool_timeout_s=2.0, fork_threshold=1024)
    base.update(kw)
    return TurnLimits(**base)


async def run(tok, texts, tools=("mt_tools:lookup",), versions=("1",), **kw):
    t = load_tools(list(tools))
    gen, calls = scripted(tok, texts, versions)
    res = await run_conversation(gen, tok, [{"role": "user", "content": "find x"}], tools=t,
                                 schemas=[tool_schema(f) for f in t.values()], limits=limits(**kw),
                                 version_of=lambda lb: 0 if lb is None else int(lb))
    return res, calls


async def test_tool_turn_then_answer_is_one_clean_row(tok):
    mt_tools.TABLE["x"] = "SECRET"
    res, calls = await run(tok, [CALL, "The answer is 42."], versions=("1", "2"))
    assert res.turns == 2 and res.tool_calls == 1 and res.tool_failures == 0
    assert res.messages[1] == {"role": "tool", "name": "lookup", "content": "x=SECRET"}
    # the second prompt contains the tool output the test controls, as context
    second_prompt = tok.decode(calls[1][0])
    assert "<tool_response>\nx=SECRET\n</tool_response>" in second_prompt
    assert len(res.rows) == 1 and res.tally.fork == 0
    row = res.rows[0]
    assert row.ids[:len(calls[1][0])] == calls[1][0]           # the row extends the re-rendered prompt
    trained = [t for t, m in zip(row.ids, row.mask) if m]
    assert len(trained) == res.generated                        # every generated token trained once
    assert all(lp == -0.5 for lp, m in zip(row.logprobs, row.mask) if m)
    assert all(lp == 0.0 for lp, m in zip(row.logprobs, row.mask) if not m)
    assert {v for v, _, _ in row.spans()} == {1, 2} and row.oldest_version() == 1
    # the budget is shared: the second turn got what the first left
    n_call = len(tok(CALL, add_special_tokens=False)["input_ids"]) + 1
    assert calls[0][1] == 200 and calls[1][1] == 200 - n_call
    assert res.tally.clean == 2  # the template re-renders the call exactly as generated


async def test_budget_is_over_the_whole_conversation(tok):
    n_call = len(tok(CALL, add_special_tokens=False)["input_ids"]) + 1
    res, calls = await run(tok, [CALL, "The answer is " + "one two three four " * 20], budget=n_call + 5)
    assert calls[1][1] == 5 and res.generated == n_call + 5


async def test_max_iters_zero_leaves_the_call_unexecuted(tok):
    res, _calls = await run(tok, [CALL, "never"], max_iters=0)
    assert res.turns == 1 and res.tool_calls == 0 and res.loop_exhausted
    assert len(res.rows) == 1


async def test_failures_and_async_tools(tok):
    calls_text = ('<tool_call>{"name": "explode", "arguments": {"x": 1}}</tool_call>'
                  '<tool_call>{"name": "stall", "arguments": {"x": 1}}</tool_call>'
                  '<tool_call>{"name": "async_double", "arguments": {"x": 21}}</tool_call>')
    res, _ = await run(tok, [calls_text, "done"], tool_timeout_s=0.3,
                       tools=("mt_tools:explode", "mt_tools:stall", "mt_tools:async_double"))
    assert res.tool_calls == 3 and res.tool_failures == 2
    contents = [m["content"] for m in res.messages if m["role"] == "tool"]
    assert "exploded on purpose" in json.loads(contents[0])["error"]
    assert "timed out" in json.loads(contents[1])["error"]
    assert contents[2] == "42"


async def test_context_limit_caps_a_turn(tok):
    _res, calls = await run(tok, [CALL, "The answer"], max_model_len=10_000, budget=10_000)
    assert all(mt <= 10_000 - len(p) for p, mt in calls)
