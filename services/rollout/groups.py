"""A group in flight (one prompt, num_generations conversations) and its all-or-nothing gather.

Shared by both generation strategies (single_turn.py, multiturn/runner.py) and the engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Group:
    """One prompt being generated and scored."""

    key: tuple[int, int]
    group_id: str
    dispatch_version: int
    started: float = field(default_factory=time.monotonic)
    completions: list[Any] = field(default_factory=list)
    """What the strategy generated: vLLM Completions, or multi-turn ConversationResults."""
    version: int = 0
    generated_at: float = 0.0
    task: asyncio.Task | None = None
    slots: int = 0
    """In-flight slots this group still holds (one per unfinished request)."""

    def request_id(self, i: int) -> str:
        """vLLM request id of generation i (turns add their own suffix)."""
        return f"{self.group_id}-{i}"

    @property
    def cache_salt(self) -> str:
        """vLLM's prefix-cache salt: a prompt's cached KV is reused only by requests dispatched at
        the same version, never across a weight update (which may keep running requests and so
        cannot always drop the cache: trainer.recompute_in_flight false)."""
        return f"v{self.dispatch_version}"


@dataclass
class GenerationContext:
    """What a strategy may use of the engine: where to generate, how, and the slot books."""

    balancer: Any
    sampling: Any
    num_generations: int
    release: Callable[[Group, int], None]
    """Give back n of a group's in-flight slots (a request or conversation ended)."""
    request_slots: asyncio.Semaphore
    """Held while one request (single-turn) or conversation (multi-turn) runs at vLLM: at most
    max_inflight_tasks of them, as TRL's slots; a group's others wait for theirs."""
    count_tokens: Callable[[int], None]
    """Account n generated tokens (throughput gauge)."""
    adapter: Callable[[], str] = lambda: ""
    """The newest LoRA adapter announced as served (adapter-only sync: PolicyVersion.lora_adapter), ""
    for full weights. Read when a request is sent, not when its group was dispatched: a request
    that waited for a slot generates under the newest adapter, as it would under the newest
    full weights."""


async def gather_or_cancel(coros) -> list:
    """Results of all coroutines, or the first failure with the others cancelled (a group
    is all or nothing: a partial group cannot get fair advantages)."""
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
