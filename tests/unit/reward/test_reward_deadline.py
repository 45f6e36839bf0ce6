"""Per-item time limits (services/reward/deadline.py), in this process's main thread."""

from __future__ import annotations

import threading
import time

from agrpo.services.reward import deadline
from agrpo.services.reward.results import TimedOut


def _sleepy(slow: set[int], fast_s: float = 0.0):
    def score_one(i: int) -> float:
        time.sleep(60 if i in slow else fast_s)
        return float(i)
    return score_one


def test_an_item_past_its_limit_times_out_alone():
    start = time.monotonic()
    out = deadline.score_each(4, _sleepy({1}), limit_s=0.2)
    assert out[0] == 0.0 and out[2:] == [2.0, 3.0]
    assert isinstance(out[1], TimedOut) and "per-item limit" in out[1].reason
    assert time.monotonic() - start < 5


def test_slow_items_share_the_call_budget_and_fast_ones_are_scored():
    # C3: however many slow items there are, the call returns within its budget and
    # the fast items keep their values.
    start = time.monotonic()
    with deadline.call_budget(1.5):
        out = deadline.score_each(8, _sleepy({0, 1, 2}, fast_s=0.01), limit_s=5.0)
    elapsed = time.monotonic() - start
    assert [isinstance(v, TimedOut) for v in out] == [True] * 3 + [False] * 5
    assert out[3:] == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert elapsed < 1.5


def test_an_item_cut_by_its_share_gets_a_second_try():
    calls: list[int] = []

    def score_one(i: int) -> float:
        calls.append(i)
        if i == 0 and calls.count(0) == 1:
            time.sleep(60)  # the first try runs out of its share
        return float(i)

    with deadline.call_budget(2.0):
        out = deadline.score_each(4, score_one, limit_s=None)
    assert out == [0.0, 1.0, 2.0, 3.0] and calls.count(0) == 2


def test_no_limits_outside_the_main_thread():
    result = {}
    thread = threading.Thread(target=lambda: result.update(
        v=deadline.score_each(2, lambda i: (time.sleep(0.3), float(i))[1], limit_s=0.05)))
    thread.start()
    thread.join(10)
    assert result["v"] == [0.0, 1.0]
