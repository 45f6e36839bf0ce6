"""Per-item results and totals: exact sums, overflow, per-item timeouts."""

from __future__ import annotations

import math

from agrpo.services.reward.registry import coerce_output
from agrpo.services.reward.results import Status, TimedOut, combine, per_item, weighted_sum


def test_totals_of_huge_finite_weights_overflow_to_inf_not_an_error():
    # C1: math.fsum raised OverflowError on [1e308, 1e308], which became INTERNAL.
    assert weighted_sum([(1e308, 1.0), (1e308, 1.0)]) == math.inf
    assert weighted_sum([(-1e308, 1e308)]) == -math.inf
    # Products past the double range that cancel are summed exactly.
    assert weighted_sum([(1e308, 10.0), (-1e308, 10.0)]) == 0.0
    assert weighted_sum([(1e308, 10.0), (-1e308, 9.0)]) == 1e308
    assert weighted_sum([(0.5, 0.1), (1.0, 2.0)]) == 2.05
    column = [(Status.OK, 1.0, "")]
    (item,) = combine(["a", "b"], [1e308, 1e308], [column, column])
    assert item.total == math.inf and [s.status for s in item.scores] == [Status.OK] * 2


def test_huge_ints_and_timed_out_items():
    values = coerce_output([1e308, 10**400, -(10**400), None, TimedOut("slow")])
    assert values[:3] == [1e308, math.inf, -math.inf]
    statuses = [s for s, _, _ in per_item("ok", values, "", 5)]
    assert statuses == [Status.OK, Status.FAILED, Status.FAILED, Status.NOT_APPLICABLE,
                        Status.TIMEOUT]
    assert per_item("ok", values, "", 5)[4][2] == "slow"
