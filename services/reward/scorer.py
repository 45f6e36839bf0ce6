"""One scoring request, in domain terms: check it, fan it out to the pool, add it up.

Admission is bounded: at most `capacity` requests are admitted at once (the workers'
share plus `max_queue` waiting); one more is refused at once with RESOURCE_EXHAUSTED
rather than queued without bound.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

from services.common.errors import InvalidArgument, NotFound, ResourceExhausted
from services.common.logging import get_logger

from .metrics import RewardMetrics
from .pool import WorkerPool
from .registry import RESERVED_ARGS, FunctionInfo
from .results import ItemScore, combine, per_item

log = get_logger("reward.scorer")


@dataclass
class ScoreBatch:
    """Items to score, already in TRL's Python shapes (strings or message dicts)."""

    prompts: list[Any]
    completions: list[Any]
    completion_ids: list[list[int]]
    columns: list[dict[str, Any]]


@dataclass(frozen=True)
class Selected:
    """A function chosen for a request, with the weight in force."""

    index: int
    info: FunctionInfo
    weight: float


class Scorer:
    """Validates requests, runs each selected function once per request, combines."""

    def __init__(self, infos: list[FunctionInfo], pool: WorkerPool, metrics: RewardMetrics, *,
                 max_items: int, capacity: int, call_timeout_s: float) -> None:
        self.infos = infos
        self._pool, self._metrics = pool, metrics
        self._max_items, self.capacity, self._timeout = max_items, capacity, call_timeout_s
        self._index: dict[str, int] = {}
        for i, info in enumerate(infos):
            if info.name in self._index:
                if not info.default_enabled:
                    continue  # an offered built-in shadowed by a configured function
                raise ValueError(f"two reward functions are named {info.name!r}; give one an alias")
            self._index[info.name] = i
        self.listed = [info for i, info in enumerate(infos) if self._index[info.name] == i]
        for i, info in enumerate(infos):  # built-ins also answer to their short name
            short = info.source.removeprefix("builtin:")
            if info.builtin and short not in self._index:
                self._index[short] = i
        self._active = 0

    def select(self, refs: list[tuple[str, float]]) -> list[Selected]:
        """The functions a request names (weight 0: configured weight), or the defaults."""
        if not refs:
            chosen = [Selected(i, info, info.weight) for i, info in enumerate(self.infos)
                      if info.default_enabled]
            if not chosen:
                raise InvalidArgument("functions: none named and the server has no default "
                                      "reward functions configured")
            return chosen
        chosen, seen = [], set()
        for name, weight in refs:
            if name not in self._index:
                raise NotFound(f"functions: unknown reward function {name!r}; known: "
                               f"{', '.join(i.name for i in self.listed)}")
            index = self._index[name]
            if index in seen:
                raise InvalidArgument(f"functions: {name!r} is named twice")
            if not math.isfinite(weight):
                raise InvalidArgument(f"functions: weight of {name!r} is not finite ({weight})")
            seen.add(index)
            info = self.infos[index]
            chosen.append(Selected(index, info, weight or info.weight))
        return chosen

    def check(self, batch: ScoreBatch, chosen: list[Selected]) -> list[str]:
        """Raise InvalidArgument for a malformed batch; return its column names."""
        n = len(batch.completions)
        if n == 0:
            raise InvalidArgument("items: empty; send at least one item")
        if n > self._max_items:
            raise InvalidArgument(f"items: {n} items is more than the limit of {self._max_items} "
                                  "(reward.max_items); split the request")
        keys = sorted(batch.columns[0])
        for i, cols in enumerate(batch.columns[1:], start=1):
            if sorted(cols) != keys:
                raise InvalidArgument(f"items[{i}].columns: has {sorted(cols)} but items[0] has "
                                      f"{keys}; every item needs the same columns")
        reserved = set(keys) & {*RESERVED_ARGS, "prompt", "completion"}
        if reserved:
            raise InvalidArgument(f"columns: {sorted(reserved)} are reserved names (they come "
                                  "from the item's prompt/completion fields)")
        for sel in chosen:
            missing = [c for c in sel.info.required_columns if c not in keys]
            if missing:
                raise InvalidArgument(f"columns: reward function {sel.info.name!r} needs column(s) "
                                      f"{missing}; the items have {keys}")
        return keys

    async def score(self, batch: ScoreBatch,
                    refs: list[tuple[str, float]]) -> tuple[list[ItemScore], dict[str, float]]:
        """Scores per item and each function's wall time in ms (raises domain errors)."""
        chosen = self.select(refs)
        keys = self.check(batch, chosen)
        if self._active >= self.capacity:
            raise ResourceExhausted(f"reward service is at capacity ({self.capacity} requests "
                                    "admitted); retry with backoff")
        self._active += 1
        self._metrics.in_flight.set(self._active)
        start = time.monotonic()
        try:
            kwargs = {"prompts": batch.prompts, "completions": batch.completions,
                      "completion_ids": batch.completion_ids,
                      **{k: [cols[k] for cols in batch.columns] for k in keys}}
            outcomes = await asyncio.gather(*(self._pool.run(s.index, kwargs, self._timeout)
                                              for s in chosen))
        finally:
            self._active -= 1
            self._metrics.in_flight.set(self._active)
            self._metrics.request_latency.observe(time.monotonic() - start)
        n = len(batch.completions)
        columns, latency = [], {}
        for sel, outcome in zip(chosen, outcomes):
            column = per_item(outcome.status, outcome.values, outcome.reason, n)
            if outcome.status != "ok":
                log.warning("reward function %s %s: %s", sel.info.name, outcome.status,
                            outcome.reason, extra={"items": n})
            self._metrics.record_call(sel.info.name, outcome.status, outcome.elapsed_s,
                                      [status for status, _, _ in column])
            columns.append(column)
            latency[sel.info.name] = outcome.elapsed_s * 1000.0
        items = combine([s.info.name for s in chosen], [s.weight for s in chosen], columns)
        return items, latency
