"""`verify` (agrpo audit) proves exactly-once from the audit log alone, and finds each violation."""

import json

from agrpo.services.trainer.audit import agrees_with_checkpoint, main, trained_per_epoch, verify
from agrpo.services.trainer.checkpoint import STATE_FILE
from agrpo.services.trainer.ledger import Ledger
from agrpo.services.trainer.state import TrainState


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _rec(step, sid, key, group, staleness=0, size=0):
    return {"step": step, "sample_id": sid, "prompt_key": list(key), "group_id": group, "staleness": staleness,
            "group_size": size}


def test_a_clean_log_passes(tmp_path):
    log = tmp_path / "trained_samples.jsonl"
    _write(log, [_rec(1, "a", (0, 0), "g0"), _rec(1, "b", (0, 0), "g0"), _rec(2, "c", (1, 0), "g1", 2),
                 _rec(3, "d", (0, 1), "g2", 1), _rec(3, "e", (1, 1), "g3")])
    v = verify(log, max_staleness=2, prompts_per_epoch=2)
    assert v.ok and (v.samples, v.prompt_keys, v.steps, v.max_staleness_seen) == (5, 4, 3, 2)
    (tmp_path / "run.json").write_text(json.dumps({"max_staleness": 2}))
    assert main([str(tmp_path), "--prompts", "2"]) == 0


def test_each_violation_is_named(tmp_path):
    log = tmp_path / "trained_samples.jsonl"
    _write(log, [_rec(2, "a", (0, 0), "g0"), _rec(1, "a", (0, 0), "g0"), _rec(2, "b", (0, 0), "g9", 3),
                 _rec(3, "c", (0, 1), "g2")])
    v = verify(log, max_staleness=2, prompts_per_epoch=2)
    text = " | ".join(v.problems)
    assert "sample a trained twice" in text and "step 1 after step 2" in text
    assert "staleness 3" in text and "trained by 2 groups" in text and "epoch 0: 1 of 2" in text
    assert main([str(tmp_path), "--max-staleness", "2"]) == 1


def test_a_group_trained_without_all_its_rows_is_named(tmp_path):
    log = tmp_path / "trained_samples.jsonl"
    _write(log, [_rec(1, "a", (0, 0), "g0", size=2), _rec(2, "b", (0, 0), "g0", size=2),
                 _rec(2, "c", (1, 0), "g1", size=3), _rec(2, "d", (1, 0), "g1", size=3)])
    v = verify(log)
    assert v.problems == ["group g1: 2 of its 3 rows trained"]


def _checkpoint(out, step, ids, keys):
    ledger = Ledger()
    ledger.trained_ids, ledger.trained_keys = set(ids), set(keys)
    d = out / f"checkpoint-{step}"
    d.mkdir()
    (d / STATE_FILE).write_text(json.dumps(TrainState(step=step, version=step + 1, ledger=ledger).to_dict()))
    return d


def test_the_audit_agrees_with_the_latest_checkpoint_ledger(tmp_path):
    log = tmp_path / "trained_samples.jsonl"
    _write(log, [_rec(1, "a", (0, 0), "g0"), _rec(2, "b", (1, 0), "g1"), _rec(3, "c", (2, 0), "g2")])
    assert agrees_with_checkpoint(log, _checkpoint(tmp_path, 2, {"a", "b"}, {(0, 0), (1, 0)})) == []
    assert main([str(tmp_path)]) == 0
    wrong = _checkpoint(tmp_path, 3, {"a", "b", "x"}, {(0, 0), (1, 0), (7, 0)})
    problems = " | ".join(agrees_with_checkpoint(log, wrong))
    assert "1 sample ids of its ledger" in problems and "1 logged ones" in problems
    assert "1 prompt keys of its ledger never appear" in problems
    assert main([str(tmp_path)]) == 1


def _epochs(tmp_path, trained):
    """A log of one-row groups: `trained` maps an epoch to the prompt indices trained in it."""
    log = tmp_path / "trained_samples.jsonl"
    keys = [(i, e) for e, idx in trained.items() for i in idx]
    _write(log, [_rec(n, f"s{n}", key, f"g{n}") for n, key in enumerate(keys, 1)])
    return log


def test_a_run_stopped_early_owes_the_prompts_in_flight_after_its_last_whole_epoch(tmp_path):
    # Epoch 1 lost prompt 3 while epoch 2 started (a re-issue in flight at the stop): owed, not lost.
    log = _epochs(tmp_path, {0: [0, 1, 2, 3], 1: [0, 1, 2], 2: [1]})
    v = verify(log, prompts_per_epoch=4, finished=False)
    assert v.ok and v.owed == {1: 1}
    assert "1 prompts of epoch 1" in v.line() and v.line().startswith("exactly once: OK")
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "finished": False}))
    assert main([str(tmp_path), "--prompts", "4"]) == 0
    # The same log from a run that ended by itself lost it; so does a stopped run whose later epoch is whole.
    assert verify(log, prompts_per_epoch=4).problems == ["epoch 1: 1 of 4 prompts never trained"]
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "finished": True}))
    assert main([str(tmp_path), "--prompts", "4"]) == 1
    whole_after = _epochs(tmp_path, {0: [0, 1, 3], 1: [0, 1, 2, 3], 2: [0]})
    v = verify(whole_after, prompts_per_epoch=4, finished=False)
    assert v.problems == ["epoch 0: 1 of 4 prompts never trained"] and v.owed == {}


def test_prompts_trained_per_epoch_are_counted_once_each_from_a_live_log(tmp_path):
    log = tmp_path / "trained_samples.jsonl"
    assert trained_per_epoch(log) == {}  # before the first step
    _write(log, [_rec(1, "a", (0, 0), "g0"), _rec(1, "b", (0, 0), "g0"), _rec(2, "c", (1, 0), "g1"),
                 _rec(2, "d", (0, 1), "g2")])
    assert trained_per_epoch(log) == {0: 2, 1: 1}
