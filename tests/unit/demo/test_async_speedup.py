"""benchmarks/async_speedup.py: its --pin, --set and --variant reading (a typo or an unusable
core is one line, before anything starts) and the order of its runs."""

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


@pytest.mark.parametrize("text, says", [
    ("x={bad", "not JSON"), ("x=[1]", "a JSON object"), ("={}", "NAME=JSON"), ("x", "NAME=JSON")])
def test_variant_refuses_what_is_not_name_and_json_object(text, says):
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        bench.named_variant(text)
    assert bench.named_variant('inf48={"max_inflight_tasks": 48}') == ("inf48", {"max_inflight_tasks": 48})


@pytest.mark.parametrize("args, env, says", [
    (["--variant", 'x={"max_inflight_task": 3}'], {}, "did you mean max_inflight_tasks"),
    (["--set", '{"trainer": {"schedul": "sync"}}'], {}, "trainer.schedul: unknown key"),
    ([], {"AGRPO_LERNING_RATE": "1"}, "AGRPO_LERNING_RATE"),
])
def test_a_config_typo_in_any_run_stops_before_the_first_starts(args, env, says, tmp_path, monkeypatch, capsys):
    from agrpo.demo import runner

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(runner, "run", lambda opts: pytest.fail(f"a run started: {opts.out}"))
    assert bench.main(["--steps", "4", "--staleness", "2", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("[bench] config error:") and says in err and "\n" not in err
    assert not list(tmp_path.iterdir())


def test_a_variant_does_not_leak_into_set_or_later_runs(tmp_path):
    """--set merged into every run, then a variant on top: the variant used to change --set
    itself (a shared nested dict), so sync and the plain async run got it too."""
    a = argparse.Namespace(set={"rollout": {"one_request_per_group": True}}, steps=4, num_prompts=8, out=tmp_path,
                           cache=tmp_path, learning_rate=None, no_pin=True, pin={})
    n1 = {"rollout": {"one_request_per_group": False}}
    overrides = [bench.demo_options(label, schedule, s, seed, a, variant).overrides
                 for label, schedule, s, seed, variant in bench.run_plan([0], [2], [("n1", n1)])]
    assert [o["rollout"]["one_request_per_group"] for o in overrides] == [True, True, False]
    assert a.set == {"rollout": {"one_request_per_group": True}}
