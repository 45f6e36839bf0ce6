"""`verify` (agrpo audit) proves exactly-once from the audit log alone, and finds each violation."""

import json

from services.trainer.audit import main, verify


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _rec(step, sid, key, group, staleness=0):
    return {"step": step, "sample_id": sid, "prompt_key": list(key), "group_id": group, "staleness": staleness}


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
