"""The step log: JSONL records and the report_to backends (tensorboard, when installed)."""

import json

import pytest

from agrpo.services.trainer.metrics import StepLogger


def test_jsonl_and_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    logger = StepLogger(tmp_path / "m.jsonl", 1, "tensorboard", logging_dir=str(tmp_path / "tb"))
    logger.log(1, {"loss": 0.5, "reward": float("nan"), "rewards/acc/mean": 1.0})
    rec = json.loads((tmp_path / "m.jsonl").read_text())
    assert rec["step"] == 1 and rec["loss"] == 0.5 and "reward" not in rec  # NaN filtered, as TRL
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for backend in logger.backends:  # flush
        backend(2, {"loss": 0.25})
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert "loss" in acc.Tags()["scalars"] or "loss" in acc.Tags().get("tensors", [])
