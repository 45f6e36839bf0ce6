"""Tools: load by `module:callable`, describe (JSON schema), parse calls, execute.

- Schemas come from type hints and Google-style docstrings
  (`transformers.utils.get_json_schema`), passed to the chat template as `tools=`.
- Calls are parsed with the tokenizer's response schema when it has one
  (`tokenizer.parse_response`), else from Qwen-style `<tool_call>{json}</tool_call>`.
- Execution: async tools awaited, sync tools in a worker thread, each under a
  per-call timeout. An exception, a timeout or an unknown tool becomes a tool
  message carrying the error and counts as a failure; nothing is raised.
  (A timed-out sync tool's thread cannot be killed; it finishes in the background.)
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agrpo.services.common.imports import load_object

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def load_callable(spec: str) -> Callable:
    """`package.module:attr` (or `script.py:attr`, `pickle:file`) -> the callable it names."""
    obj = load_object(spec)
    if not callable(obj):
        raise TypeError(f"{spec!r} is not callable")
    return obj


def tool_name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def tool_schema(fn: Callable) -> dict:
    """The function's JSON schema (raises if hints or docstring are missing)."""
    from transformers.utils import get_json_schema

    return get_json_schema(fn)


def load_tools(specs: list[str]) -> dict[str, Callable]:
    """Name -> callable for the configured tools; duplicate names are an error."""
    tools: dict[str, Callable] = {}
    for spec in specs:
        fn = load_callable(spec)
        name = tool_name(fn)
        if name in tools:
            raise ValueError(f"two tools are named {name!r}")
        tool_schema(fn)  # fail at start, not mid-rollout
        tools[name] = fn
    return tools


@dataclass
class ToolCall:
    name: str
    arguments: dict


@dataclass
class ParsedResponse:
    """The assistant turn as a message: text content and tool calls."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Tool-call blocks that were not valid JSON {name, arguments}."""

    def message(self) -> dict:
        msg: dict = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [{"type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in self.tool_calls]
        return msg


def _call_from(obj: Any) -> ToolCall:
    if not isinstance(obj, dict):
        raise ValueError("tool call is not an object")
    fn = obj.get("function", obj)
    name, args = fn.get("name"), fn.get("arguments", {})
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    if not isinstance(name, str) or not isinstance(args, dict):
        raise ValueError("tool call needs a string name and object arguments")
    return ToolCall(name, args)


def parse_tool_text(text: str) -> ParsedResponse:
    """Qwen-style parsing: content is the text outside the <tool_call> blocks."""
    calls, errors = [], []
    for block in TOOL_CALL_RE.findall(text):
        try:
            calls.append(_call_from(json.loads(block)))
        except (ValueError, AttributeError) as exc:
            errors.append(f"{block[:200]!r}: {exc}")
    content = TOOL_CALL_RE.sub("", text)
    if "<tool_call>" in content:  # an unterminated call (cut by the budget)
        content = content.split("<tool_call>", 1)[0]
    return ParsedResponse(content.strip(), calls, errors)


def parse_response(tokenizer, text: str) -> ParsedResponse:
    """Transformers' response parsing when the tokenizer declares a schema, else ours."""
    if getattr(tokenizer, "response_schema", None):
        try:
            msg = tokenizer.parse_response(text)
            calls = [_call_from(c) for c in msg.get("tool_calls") or []]
            return ParsedResponse(str(msg.get("content") or ""), calls)
        except Exception:  # noqa: BLE001 - malformed output: fall back to plain parsing
            pass
    return parse_tool_text(text)


@dataclass
class ToolResult:
    name: str
    content: str
    ok: bool
    latency_s: float

    def message(self) -> dict:
        return {"role": "tool", "name": self.name, "content": self.content}


async def execute(call: ToolCall, tools: dict[str, Callable], timeout_s: float) -> ToolResult:
    """Run one call; failures become an error message, never an exception."""
    t0 = time.monotonic()
    fn = tools.get(call.name)
    try:
        if fn is None:
            raise KeyError(f"unknown tool {call.name!r}; available: {sorted(tools)}")
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
            result = await asyncio.wait_for(fn(**call.arguments), timeout_s)
        else:
            result = await asyncio.wait_for(asyncio.to_thread(fn, **call.arguments), timeout_s)
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, timeout_s)
        content = result if isinstance(result, str) else json.dumps(result, default=str)
        return ToolResult(call.name, content, True, time.monotonic() - t0)
    except TimeoutError:
        err = f"tool {call.name!r} timed out after {timeout_s:g} s"
    except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's feedback
        err = f"{type(exc).__name__}: {exc}"
    return ToolResult(call.name, json.dumps({"error": err}), False, time.monotonic() - t0)
