"""Which checkpoint a trainer resumes, the version high-water mark, archives and rewinds."""

import json

import pytest

from agrpo.services.trainer import checkpoint, run_record


def _ckpt(out, step):
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / checkpoint.STATE_FILE).write_text(json.dumps({"step": step, "version": step + 1}))
    return d


def _run(out, run_id, finished=False, max_version=6):
    (out / "run.json").write_text(json.dumps({"run_id": run_id, "max_version": max_version, "finished": finished}))


def test_a_finished_run_is_moved_aside_by_a_new_one(tmp_path):
    _ckpt(tmp_path, 5)
    (tmp_path / "trained_samples.jsonl").write_text('{"step": 1}\n')
    _run(tmp_path, "old", finished=True)
    start = run_record.plan(tmp_path, None, None)
    assert start.checkpoint is None and not start.restart and start.record.max_version == 0
    assert start.archived == tmp_path / "previous" / "old"
    assert (start.archived / "checkpoint-5").is_dir() and (start.archived / "trained_samples.jsonl").exists()
    assert not (tmp_path / "checkpoint-5").exists()
    assert json.loads((tmp_path / "run.json").read_text())["run_id"] == start.record.run_id != "old"


def test_true_resumes_the_latest_and_a_path_that_one(tmp_path):
    _ckpt(tmp_path, 2)
    latest = _ckpt(tmp_path, 4)
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "max_version": 9}))
    start = run_record.plan(tmp_path, None, True)
    assert start.checkpoint == latest and start.record.max_version == 9 and start.record.run_id == "r"
    assert run_record.plan(tmp_path, None, str(tmp_path / "checkpoint-2")).checkpoint == tmp_path / "checkpoint-2"
    with pytest.raises(run_record.ResumeError, match="resume_from_checkpoint"):
        run_record.plan(tmp_path, None, str(tmp_path / "nope"))
    with pytest.raises(run_record.ResumeError, match="no checkpoint"):
        run_record.plan(tmp_path / "empty", None, True)


@pytest.mark.parametrize(("run_id", "resume", "finished", "continues"), [
    (None, None, False, True),      # a supervisor's plain restart after a crash: continue
    ("run-7", None, False, True),   # its own run id
    ("run-7", None, True, True),    # its own run id, even after the end (it is done at once)
    (None, None, True, False),      # a finished run: a new one
    ("run-8", None, False, False),  # another run id (agrpo run's next invocation): a new one
    (None, False, False, False),    # resume_from_checkpoint: false stated
    (None, "false", False, False),  # ... from an env var or flag
])
def test_which_start_continues_the_run_in_output_dir(tmp_path, run_id, resume, finished, continues):
    latest = _ckpt(tmp_path, 3)
    _run(tmp_path, "run-7", finished=finished, max_version=8)
    start = run_record.plan(tmp_path, run_id, resume)
    assert start.restart is continues
    if continues:
        assert start.checkpoint == latest and start.record.run_id == "run-7" and start.record.max_version == 8
        assert start.archived is None and latest.is_dir()
    else:
        assert start.checkpoint is None and start.record.max_version == 0 and not start.record.finished
        assert (start.archived / "checkpoint-3").is_dir() and not latest.exists()


def test_an_interrupted_run_without_a_checkpoint_continues_its_versions(tmp_path):
    _run(tmp_path, "r", max_version=4)
    start = run_record.plan(tmp_path, None, None)
    assert start.restart and start.checkpoint is None and start.record.max_version == 4


def test_finish_is_recorded(tmp_path):
    rec = run_record.plan(tmp_path, None, None).record
    assert not run_record.read(tmp_path).finished
    rec.finish()
    assert run_record.read(tmp_path).finished
    assert not run_record.plan(tmp_path, None, None).restart


def test_same_run_id_is_a_restart(tmp_path):
    latest = _ckpt(tmp_path, 3)
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "run-7", "max_version": 8}))
    start = run_record.plan(tmp_path, "run-7", None)
    assert start.restart and start.checkpoint == latest and start.record.max_version == 8
    assert not run_record.plan(tmp_path, "run-8", None).restart  # another run: fresh, archived


def test_reserve_is_monotone_and_durable(tmp_path):
    rec = run_record.plan(tmp_path, "x", None).record
    rec.reserve(3)
    rec.reserve(2)
    assert run_record.read(tmp_path).max_version == 3


def test_rewind_moves_later_steps_aside(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3, 4)) + '{"step": 5, "cut')
    assert run_record.rewind(f, 2) == 2
    assert [json.loads(x)["step"] for x in f.read_text().splitlines()] == [1, 2]
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.rolled_back.jsonl").read_text().splitlines()] == [3, 4]
