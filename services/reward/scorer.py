"""One scoring request, in domain terms: check it, fan it out to the pool, add it up.

Callers hold an admission slot (admission.py) around `score`. Error messages echo the
caller's names through `shown`, which bounds them: an error's message travels in the
gRPC trailer, and a trailer above 16 KiB makes C-core clients drop the whole status.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agrpo.services.common.errors import InvalidArgument, NotFound
from agrpo.services.common.logging import get_logger

from .admission import Admission
from .metrics import RewardMetrics
from .pool import WorkerPool
from .registry import RESERVED_ARGS, FunctionInfo
from .results import ItemScore, combine, per_item

log = get_logger("reward.scorer")

SHOWN_CHARS = 80
"""Longest echo of one caller-supplied value in an error message."""
SHOWN_ITEMS = 8
"""Most entries of a caller-supplied list echoed in an error message."""


def shown(value: Any) -> str:
    """`value` for an error message: ASCII-escaped and cut to SHOWN_CHARS characters."""
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]!a}... ({len(value)} chars)"
    text = ascii(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}..."


def shown_list(values: Iterable[Any]) -> str:
    """A list for an error message: its first SHOWN_ITEMS entries, each `shown`."""
    values = list(values)
    more = f", ... ({len(values)} in all)" if len(values) > SHOWN_ITEMS else ""
    return "[" + ", ".join(shown(v) for v in values[:SHOWN_ITEMS]) + more + "]"


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
                 max_items: int, capacity: int, num_workers: int, call_timeout_s: float) -> None:
        self.infos = infos
        self._pool, self._metrics = pool, metrics
        self._max_items, self._timeout = max_items, call_timeout_s
        self.admission = Admission(capacity, num_workers, metrics.in_flight.set)
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
                raise NotFound(f"functions: unknown reward function {shown(name)}; known: "
                               f"{shown_list(i.name for i in self.listed)}")
            index = self._index[name]
            if index in seen:
                raise InvalidArgument(f"functions: {shown(name)} is named twice")
            if not math.isfinite(weight):
                raise InvalidArgument(f"functions: weight of {shown(name)} is not finite ({weight})")
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
                raise InvalidArgument(f"items[{i}].columns: has {shown_list(sorted(cols))} but "
                                      f"items[0] has {shown_list(keys)}; every item needs the "
                                      "same columns")
        reserved = set(keys) & {*RESERVED_ARGS, "prompt", "completion"}
        if reserved:
            raise InvalidArgument(f"columns: {sorted(reserved)} are reserved names (they come "
                                  "from the item's prompt/completion fields)")
        for sel in chosen:
            missing = [c for c in sel.info.required_columns if c not in keys]
            if missing:
                raise InvalidArgument(f"columns: reward function {sel.info.name!r} needs column(s) "
                                      f"{missing}; the items have {shown_list(keys)}")
        return keys

    async def score(self, batch: ScoreBatch,
                    refs: list[tuple[str, float]]) -> tuple[list[ItemScore], dict[str, float]]:
        """Scores per item and each function's wall time in ms (raises domain errors).
        The caller holds an admission slot."""
        chosen = self.select(refs)
        keys = self.check(batch, chosen)
        start = time.monotonic()
        try:
            kwargs = {"prompts": batch.prompts, "completions": batch.completions,
                      "completion_ids": batch.completion_ids,
                      **{k: [cols[k] for cols in batch.columns] for k in keys}}
            outcomes = await asyncio.gather(*(self._pool.run(s.index, kwargs, self._timeout)
                                              for s in chosen))
        finally:
            self._metrics.request_latency.observe(time.monotonic() - start)
        self.admission.observe(sum(o.elapsed_s for o in outcomes))
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
