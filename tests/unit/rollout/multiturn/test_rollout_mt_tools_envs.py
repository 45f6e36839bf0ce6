"""Tools: loading, schema, parsing, execution (sync, async, raising, hanging);
environments: probing, pooling, per-row choice, reset text, rewards."""

import json

import pytest

import mt_tools
from agrpo.services.rollout.multiturn import environments as envs
from agrpo.services.rollout.multiturn.tools import ToolCall, execute, load_callable, load_tools, parse_tool_text


def test_load_tools_and_schema():
    tools = load_tools(["mt_tools:lookup", "mt_tools:async_double"])
    assert set(tools) == {"lookup", "async_double"}
    from agrpo.services.rollout.multiturn.tools import tool_schema
    schema = tool_schema(tools["lookup"])
    assert schema["function"]["name"] == "lookup"
    assert schema["function"]["parameters"]["properties"]["key"]["type"] == "string"
    with pytest.raises(ValueError):
        load_callable("no_colon")


def test_parse_tool_calls():
    text = ('I will look.<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>'
            '<tool_call>{"name": "x", "arguments": "{\\"y\\": 1}"}</tool_call><tool_call>not json</tool_call>')
    p = parse_tool_text(text)
    assert p.content == "I will look."
    assert [(c.name, c.arguments) for c in p.tool_calls] == [("lookup", {"key": "a"}), ("x", {"y": 1})]
    assert len(p.errors) == 1
    msg = p.message()
    assert msg["tool_calls"][0]["function"]["name"] == "lookup"
    assert parse_tool_text("plain answer").tool_calls == []
    assert parse_tool_text('ok <tool_call>{"name": "lo').content == "ok"


async def test_execute_sync_async_raise_hang_unknown():
    tools = load_tools(["mt_tools:lookup", "mt_tools:async_double", "mt_tools:explode", "mt_tools:stall"])
    mt_tools.TABLE["k"] = "7"
    r = await execute(ToolCall("lookup", {"key": "k"}), tools, 5)
    assert r.ok and r.content == "k=7"
    r = await execute(ToolCall("async_double", {"x": 4}), tools, 5)
    assert r.ok and r.content == "8"
    r = await execute(ToolCall("explode", {"x": 1}), tools, 5)
    assert not r.ok and "exploded on purpose" in json.loads(r.content)["error"]
    r = await execute(ToolCall("stall", {"x": 1}), tools, 0.2)
    assert not r.ok and "timed out" in json.loads(r.content)["error"]
    r = await execute(ToolCall("nope", {}), tools, 1)
    assert not r.ok and "unknown tool" in r.content
    r = await execute(ToolCall("lookup", {"wrong": 1}), tools, 1)
    assert not r.ok and "TypeError" in r.content


async def test_environments_single_and_dict():
    e = envs.Environments(mt_tools.CounterEnv)
    spec = e.spec_for({})
    assert spec.tool_names == ["increment"] and spec.has_reward and spec.class_name == "CounterEnv"
    assert [s.class_name for s in e.specs.values() if s.has_reward] == ["CounterEnv"]
    a = e.acquire(spec)           # the probed instance is reused
    b = e.acquire(spec)           # a second one is created
    assert a is not b and spec.created == 2
    e.release(spec, a)
    assert e.acquire(spec) is a
    text = await envs.reset(a, {"start": 3})
    assert text == " (start at 3)" and a.count == 0
    a.increment(5)
    assert await envs.env_reward(a) == 5.0

    d = envs.Environments({"counter": mt_tools.CounterEnv, "echo": mt_tools.EchoEnv})
    assert d.spec_for({"environment": "echo"}).tool_names == ["echo"]
    assert not d.spec_for({"environment": "echo"}).has_reward
    with pytest.raises(ValueError):
        d.spec_for({"environment": "missing"})


def test_append_to_last_user():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    out = envs.append_to_last_user(msgs, "!")
    assert out[1]["content"] == "q!" and msgs[1]["content"] == "q"
    assert envs.append_to_last_user(msgs, None) == msgs


def test_env_without_reset_is_rejected():
    class Bad:
        def act(self, x: int) -> int:
            """A.

            Args:
                x: x.
            """
            return x
    with pytest.raises(TypeError):
        envs.Environments(Bad)


def test_transformers_response_schema_is_used_when_declared():
    from agrpo.services.rollout.multiturn.tools import parse_response

    class SchemaTok:
        response_schema = {"type": "object"}

        def parse_response(self, text):
            return {"role": "assistant", "content": "hi",
                    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}

    p = parse_response(SchemaTok(), "whatever the template emits")
    assert p.content == "hi" and [(c.name, c.arguments) for c in p.tool_calls] == [("f", {"a": 1})]

    class NoSchema:
        response_schema = None
    assert parse_response(NoSchema(), '<tool_call>{"name": "g", "arguments": {}}</tool_call>').tool_calls[0].name == "g"
