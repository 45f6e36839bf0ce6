"""What AsyncGRPOTrainer.train() makes of the job's exit status."""

from __future__ import annotations

import pytest

from agrpo import AsyncGRPOConfig, AsyncGRPOTrainer
from agrpo.launcher import job
from agrpo.services.common.preflight import INTERRUPTED_EXIT


def _trainer(tmp_path, monkeypatch, status: int) -> AsyncGRPOTrainer:
    monkeypatch.setattr(job.Job, "run", lambda self: status)
    return AsyncGRPOTrainer(model=str(tmp_path), reward_funcs="accuracy", train_dataset="x.jsonl",
                            args=AsyncGRPOConfig(output_dir=str(tmp_path / "out")))


def test_ctrl_c_is_a_keyboard_interrupt_after_one_line_not_a_failure(tmp_path, monkeypatch, capsys):
    with pytest.raises(KeyboardInterrupt):
        _trainer(tmp_path, monkeypatch, INTERRUPTED_EXIT).train()
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "interrupted" in said[0] and str(tmp_path / "out") in said[0]
    assert "resume_from_checkpoint=True" in said[0]


def test_a_failed_job_raises_with_where_its_logs_are(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match=r"training failed \(status 1\); logs in .*out"):
        _trainer(tmp_path, monkeypatch, 1).train()
    assert _trainer(tmp_path, monkeypatch, 0).train() == 0
