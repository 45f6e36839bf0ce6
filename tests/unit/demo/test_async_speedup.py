"""benchmarks/async_speedup.py: its --pin reading (a typo or an unusable core is one argparse
line) and the order of its runs."""

import argparse
import os

import pytest

import async_speedup as bench  # benchmarks/ is on pytest's pythonpath


def test_pin_spec_reads_names_and_cores():
    core = str(min(os.sched_getaffinity(0)))
    assert bench.pin_spec(f"vllm={core},vllm_front={core}") == {"vllm": core, "vllm_front": core}


@pytest.mark.parametrize("text, says", [
    ("vllm_frnt=0", "name one of"),
    ("trainer", "name one of"),
    ("vllm=x", "not a core number"),
    ("vllm=4096", "not usable here"),
])
def test_pin_spec_refuses_bad_input(text, says):
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        bench.pin_spec(text)


def test_run_plan_orders_sync_then_each_staleness_with_its_variants():
    plan = bench.run_plan([0, 1], [2], [("inf24", {"max_inflight_tasks": 24})])
    assert [(label, schedule, s, seed) for label, schedule, s, seed, _ in plan] == [
        ("sync", "sync", 0, 0), ("async_s2", "async", 2, 0), ("async_s2_inf24", "async", 2, 0),
        ("sync", "sync", 0, 1), ("async_s2", "async", 2, 1), ("async_s2_inf24", "async", 2, 1)]
    assert plan[2][4] == {"max_inflight_tasks": 24}
