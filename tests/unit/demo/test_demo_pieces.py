"""The demo's pure pieces: its rewards (called as TRL calls one), summary and step lines."""

import json
import math

import pytest

from agrpo.demo import report
from agrpo.demo.task import digit_share, final_answer, write_arithmetic_dataset
from agrpo.launcher import progress


def test_digit_share_on_text_and_messages():
    assert digit_share(["12 34", "ab", "", "a1"]) == [1.0, 0.0, 0.0, 0.5]
    msgs = [[{"role": "assistant", "content": "42!"}]]
    assert digit_share(msgs, prompts=["p"], solution=["42"]) == [2 / 3]


def test_final_answer_reads_the_box_then_the_last_number():
    texts = ["3 + 4 = \\boxed{7}", "\\boxed{7} no, \\boxed{8}", "3 + 4 = 7", "3 + 4 = 7, not 8",
             "3 + 4 = \\boxed{} 7", "\\boxed{seven}", "seven", "17"]
    assert final_answer(texts, solution=["7"] * len(texts)) == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    msgs = [[{"role": "assistant", "content": "It is \\boxed{12}."}]]
    assert final_answer(msgs, prompts=["p"], solution=["12"]) == [1.0]


def test_dataset_is_seeded_and_conversational(tmp_path):
    a = write_arithmetic_dataset(tmp_path / "a.jsonl", 5, seed=1).read_text()
    b = write_arithmetic_dataset(tmp_path / "b.jsonl", 5, seed=1).read_text()
    assert a == b
    row = json.loads(a.splitlines()[0])
    a_, b_ = [int(x) for x in row["prompt"][0]["content"][8:-1].split(" + ")]
    assert row["prompt"][0]["role"] == "user" and row["solution"] == str(a_ + b_)
    small = write_arithmetic_dataset(tmp_path / "c.jsonl", 50, instruction=" Box it.", max_operand=9)
    rows = [json.loads(line) for line in small.read_text().splitlines()]
    assert all(r["prompt"][0]["content"].endswith("? Box it.") and int(r["solution"]) <= 18 for r in rows)


def test_summary_compares_first_and_last_ten_steps(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [{"step": i, "reward": i / 100, "loss": 0.1, "sample/staleness_max": i % 3,
             "sample/trained": 16} for i in range(1, 31)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{partial")
    read = progress.read_steps(path)
    assert len(read) == 30
    out = report.summary(read, wall_s=12.0, max_staleness=2)
    assert math.isclose(out["reward_first10"], 0.055) and math.isclose(out["reward_last10"], 0.255)
    assert out["max_trained_staleness"] == 2 and out["samples_trained"] == 480
    line = progress.step_line({"step": 3, "policy_version": 4, "reward": 0.5, "loss": -0.1,
                             "sample/staleness_mean": 1.0, "sample/trained": 10,
                             "perf/step_s": 1.0, "perf/wait_s": 1.0})
    assert "step    3" in line and "5.0 samples/s" in line and "reward 0.500" in line


def test_a_resumed_job_shows_only_its_own_steps_and_its_bar_starts_where_the_run_stopped(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    earlier = [{"step": i, "time": 100.0 + i, "policy_version": i + 1} for i in (1, 2, 3)]  # the run before the restart
    path.write_text("".join(json.dumps(r) + "\n" for r in earlier))
    follower = progress.StepFollower(path, total=5, disable_bar=True, since=200.0)
    with path.open("a") as f:
        f.write(json.dumps({"step": 4, "time": 201.0, "policy_version": 5}) + "\n")
    assert [r["step"] for r in follower.poll()] == [1, 2, 3, 4]
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    assert [line.split("|")[0].split()[1] for line in shown] == ["4"]
    assert follower.last_step == 4


def test_demo_reports_a_config_typo_in_one_line_before_building_anything(tmp_path, monkeypatch, capsys):
    from agrpo.demo import cli, runner

    monkeypatch.setenv("AGRPO_MAX_STALENES", "2")
    monkeypatch.setattr(runner, "model_dir_of", lambda opts: pytest.fail("the model was built"))
    assert cli.main(["--steps", "3", "--out", str(tmp_path / "out"), "--cache", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("[demo] config error: max_stalenes: unknown key (from the environment, "
                   "AGRPO_MAX_STALENES); did you mean max_staleness?")
