"""Drive one multi-turn conversation through vLLM, turn by turn.

Each turn re-renders the conversation (with the tools' schemas), generates with
what is left of `max_completion_length` (a budget over the whole conversation,
also capped by the model's context), parses tool calls, runs them concurrently
with a per-call timeout and appends their results as tool messages. The turns
are reconciled into training rows token for token (reconcile.py); each
generated token keeps the policy version that produced it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .reconcile import Reconciler, Row, Tally
from .tools import ToolCall, ToolResult, execute, parse_response

Generate = Callable[[list[int], int, int], Awaitable[Any]]
"""(prompt_ids, max_tokens, turn index) -> vllm_client.Completion."""


@dataclass
class ConversationResult:
    """Rows to train and what happened on the way."""

    rows: list[Row]
    messages: list[dict]
    """The completion as messages (assistant raw text, tool results), for reward functions."""
    tally: Tally
    turns: int = 0
    generated: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    tool_latencies: list[float] = field(default_factory=list)
    loop_exhausted: bool = False
    latency_s: float = 0.0
    env_rewards: dict[str, float] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(m["content"] if m["role"] == "assistant" else f"\n{m['content']}\n"
                       for m in self.messages)


@dataclass
class TurnLimits:
    budget: int
    """max_completion_length: tokens generated over the whole conversation."""
    max_model_len: int
    max_iters: int | None
    """max_tool_calling_iterations: tool rounds executed (None: no limit)."""
    tool_timeout_s: float
    fork_threshold: int


def render(tokenizer, messages: list[dict], schemas: list[dict], kwargs: dict | None) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=schemas or None, add_generation_prompt=True,
                                         tokenize=False, **(kwargs or {}))
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def token_versions(completion, version_of: Callable[[str | None], int]) -> list[int]:
    """Per-token policy version from the completion's weight spans (unknown: version_of(None))."""
    out = [version_of(None)] * len(completion.token_ids)
    for label, s, e in completion.spans:
        v = version_of(label)
        for i in range(max(s, 0), min(e, len(out))):
            out[i] = v
    return out


async def run_tools(calls: list[ToolCall], errors: list[str], tools: dict, timeout_s: float
                    ) -> list[ToolResult]:
    """All calls of one turn concurrently; unparseable calls come back as failures."""
    results = list(await asyncio.gather(*(execute(c, tools, timeout_s) for c in calls)))
    results += [ToolResult("invalid_tool_call", f'{{"error": "unparseable tool call: {e[:200]}"}}', False, 0.0)
                for e in errors]
    return results


async def run_conversation(generate: Generate, tokenizer, messages: list[dict], *, tools: dict,
                           schemas: list[dict], limits: TurnLimits,
                           version_of: Callable[[str | None], int],
                           chat_template_kwargs: dict | None = None) -> ConversationResult:
    """Generate, call tools, repeat; stop on no tool call, the iteration cap or the budget."""
    t0 = time.monotonic()
    msgs = [dict(m) for m in messages]
    rec = Reconciler(limits.fork_threshold)
    res = ConversationResult([], [], rec.tally)
    iters = 0
    while True:
        prompt_ids = render(tokenizer, msgs, schemas, chat_template_kwargs)
        max_tokens = min(limits.budget - res.generated, limits.max_model_len - len(prompt_ids))
        if max_tokens <= 0:
            break
        out = await generate(prompt_ids, max_tokens, res.turns)
        res.turns += 1
        res.generated += len(out.token_ids)
        rec.add_turn(prompt_ids, list(out.token_ids), list(out.logprobs), token_versions(out, version_of),
                     getattr(out, "output_mask", None))  # forced (not sampled) tokens carry mask 0
        text = tokenizer.decode(out.token_ids, skip_special_tokens=True)
        parsed = parse_response(tokenizer, text)
        msgs.append(parsed.message())
        res.messages.append({"role": "assistant", "content": text})
        if not parsed.tool_calls and not parsed.errors:
            break
        if limits.max_iters is not None and iters >= limits.max_iters:
            res.loop_exhausted = True  # the call is left unexecuted, as in TRL
            break
        if res.generated >= limits.budget:
            break  # no room for another turn: do not run tools whose answer nobody reads
        iters += 1
        results = await run_tools(parsed.tool_calls, parsed.errors, tools, limits.tool_timeout_s)
        for r in results:
            res.tool_calls += 1
            res.tool_failures += 0 if r.ok else 1
            res.tool_latencies.append(r.latency_s)
            msgs.append(r.message())
            res.messages.append(r.message())
    res.rows = rec.rows()
    res.latency_s = time.monotonic() - t0
    return res
