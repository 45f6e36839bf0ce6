"""From raw function outcomes to per-item scores and totals (pure; no gRPC here).

Totals follow TRL's reading of `None` (NaN, then `nansum`): a function that does not
apply to an item, or that failed on it, is left out of that item's sum. Unlike TRL's
`nansum` (which gives 0.0), an item that no function scored gets a NaN total, so the
caller can tell "unscorable" from "scored zero" (TRL then sets its advantage to 0).

    total_i = sum over functions f with status OK on item i of  weight_f * value_f,i

The sum is exact, then rounded once; weights and values are finite but their products
need not be (1e308 * 2), so a total whose magnitude exceeds the double range is +-inf,
as IEEE arithmetic would give, never an error.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from fractions import Fraction


class Status(enum.IntEnum):
    """Outcome of one function on one item (values match the proto's ScoreStatus)."""

    OK = 1
    NOT_APPLICABLE = 2
    FAILED = 3
    TIMEOUT = 4


@dataclass(frozen=True)
class FunctionScore:
    """One function on one item; `value` is meaningful only when OK."""

    name: str
    status: Status
    value: float
    weight: float
    reason: str = ""


@dataclass(frozen=True)
class TimedOut:
    """What a function returns for an item it ran out of time on (see deadline.py)."""

    reason: str


@dataclass
class ItemScore:
    """Every requested function on one item, and the weighted total."""

    total: float
    scores: list[FunctionScore] = field(default_factory=list)


def per_item(status: str, values: list[float | TimedOut | None] | None, reason: str,
             num_items: int) -> list[tuple[Status, float, str]]:
    """Split one call's outcome ("ok" / "failed" / "timeout") into per-item results."""
    nan = math.nan
    if status == "timeout":
        return [(Status.TIMEOUT, nan, reason)] * num_items
    if status != "ok":
        return [(Status.FAILED, nan, reason)] * num_items
    if values is None or len(values) != num_items:
        got = "no list" if values is None else f"{len(values)} values"
        return [(Status.FAILED, nan, f"returned {got} for {num_items} items")] * num_items
    out = []
    for value in values:
        if value is None:
            out.append((Status.NOT_APPLICABLE, nan, ""))
        elif isinstance(value, TimedOut):
            out.append((Status.TIMEOUT, nan, value.reason))
        elif not math.isfinite(value):
            out.append((Status.FAILED, nan, f"returned a non-finite value ({value})"))
        else:
            out.append((Status.OK, float(value), ""))
    return out


def combine(names: list[str], weights: list[float],
            columns: list[list[tuple[Status, float, str]]]) -> list[ItemScore]:
    """Items x functions: one ItemScore per item with its weighted total over OK scores.

    `columns[f][i]` is function f's result on item i, as returned by `per_item`."""
    num_items = len(columns[0]) if columns else 0
    items = []
    for i in range(num_items):
        scores = [FunctionScore(name, *column[i][:2], weight, column[i][2])
                  for name, weight, column in zip(names, weights, columns)]
        ok = [(s.weight, s.value) for s in scores if s.status is Status.OK]
        items.append(ItemScore(total=weighted_sum(ok) if ok else math.nan, scores=scores))
    return items


def weighted_sum(terms: list[tuple[float, float]]) -> float:
    """sum(w * v) over finite pairs, correctly rounded; +-inf past the double range.

    fsum of the products is the fast path; when a product or the running sum overflows,
    the exact rational sum decides (it may well be finite: 1e308*10 - 1e308*10)."""
    products = [w * v for w, v in terms]
    if all(math.isfinite(p) for p in products):
        try:
            return math.fsum(products)
        except OverflowError:
            pass
    exact = sum((Fraction(w) * Fraction(v) for w, v in terms), Fraction(0))
    try:
        return float(exact)
    except OverflowError:
        return math.inf if exact > 0 else -math.inf
