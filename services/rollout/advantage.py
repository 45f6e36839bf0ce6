"""Group-relative advantages, as TRL computes them (pure: no I/O, no grpc).

For a group of rewards r_1..r_G:

    A_i = (r_i - mean(r)) / (std(r) + 1e-8)

with the population standard deviation (ddof=0). NaN rewards (no reward function
applied) are ignored by mean and std, as TRL's nanmean/nanstd do; a NaN reward
gets advantage 0, and an all-NaN group gets A = 0 everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

EPS = 1e-8


def _finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(v)]


def group_stats(rewards: Sequence[float | None]) -> tuple[float, float]:
    """(mean, population std) over the non-NaN rewards; (nan, nan) when there are none."""
    vals = _finite(rewards)
    if not vals:
        return math.nan, math.nan
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / len(vals)
    return mean, math.sqrt(var)


def group_advantages(rewards: Sequence[float | None]) -> list[float]:
    """Advantages of one group; NaN/None rewards give 0."""
    mean, std = group_stats(rewards)
    if math.isnan(mean):
        return [0.0] * len(rewards)
    out = []
    for r in rewards:
        out.append(0.0 if r is None or math.isnan(r) else (float(r) - mean) / (std + EPS))
    return out

