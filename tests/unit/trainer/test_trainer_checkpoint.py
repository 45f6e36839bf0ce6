"""Checkpoints: layout, pruning, and a round trip of counters, ledger, optimizer and RNG."""

from __future__ import annotations

import random

import torch

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.trainer import checkpoint
from agrpo.services.trainer.engine_factory import build_engine
from agrpo.services.trainer.ledger import Ledger
from agrpo.services.trainer.state import TrainState


def test_save_prune_and_restore(tiny_model_dir, tmp_path, make_sample):
    cfg = AgrpoConfig(model=str(tiny_model_dir), learning_rate=1e-3)
    engine, tok, _ = build_engine(cfg, str(tiny_model_dir))
    ledger = Ledger(prompts_per_epoch=3)
    ledger.record([make_sample("a", "g", [1], [2], key=(2, 0))])
    for step in (1, 2, 3):
        state = TrainState(step=step, version=step + 1, version_step=step, ledger=ledger)
        checkpoint.save(tmp_path, state, engine.model, tok, engine.optimizer, engine.scheduler, total_limit=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-3"]
    latest = checkpoint.latest(tmp_path)
    assert (latest / "config.json").exists() and (latest / "tokenizer_config.json").exists()
    restored = checkpoint.read_state(latest)
    assert (restored.step, restored.version, restored.version_step) == (3, 4, 3)
    assert restored.ledger.trained_ids == {"a"} and restored.ledger.unfinished_keys() == [(2, 0)]

    expected = (random.random(), torch.rand(1))
    random.seed(123)
    torch.manual_seed(123)
    again, _, _ = build_engine(cfg, str(latest))
    assert checkpoint.restore_optimizer(latest, again.optimizer, again.scheduler)
    assert (random.random(), torch.rand(1)) == expected  # RNG continues where it was saved
    for p, q in zip(engine.model.parameters(), again.model.parameters()):
        assert torch.equal(p, q)


def test_half_written_checkpoint_is_ignored(tmp_path):
    (tmp_path / ".checkpoint-5.tmp").mkdir()
    (tmp_path / "checkpoint-6").mkdir()  # no state file: incomplete
    assert checkpoint.latest(tmp_path) is None
