"""LoRA on the trainer (services/trainer/lora.py): what trains, what a sync sends, what a checkpoint holds."""

from __future__ import annotations

import pytest
import torch

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.preflight import StartupError
from agrpo.services.trainer import checkpoint, lora
from agrpo.services.trainer.engine_factory import build_engine
from agrpo.services.trainer.fsdp import weights_for_sync
from agrpo.services.trainer.ledger import Ledger
from agrpo.services.trainer.state import TrainState


def _engine(model_dir, path=None, **peft):
    cfg = AgrpoConfig(model=str(model_dir), learning_rate=1e-2, peft={"r": 4, "lora_alpha": 8, **peft})
    return cfg, *build_engine(cfg, str(path or model_dir))


def _train_a_little(engine) -> None:
    """Move the adapter away from its start (B = 0) as an optimizer step would."""
    torch.manual_seed(1)
    for p in engine.model.parameters():
        if p.requires_grad:
            p.grad = torch.randn_like(p)
    engine.optimizer.step()


def test_only_the_adapter_trains_and_starts_as_the_base_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    _, engine, _, _ = _engine(tiny_model_dir)
    trainable = [n for n, p in engine.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).state_dict()
    for name, tensor in weights_for_sync(engine, None):  # B = 0: the merged weights are the base's
        assert torch.equal(tensor, base[name])


def test_a_sync_sends_the_adapted_layers_merged_under_base_names(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, engine, _, _ = _engine(tiny_model_dir)
    _train_a_little(engine)
    sent = dict(weights_for_sync(engine, None))
    adapted = [name for name, _ in lora.adapted_layers(engine.model)]
    assert sorted(sent) == sorted(f"{name}.weight" for name in adapted)  # nothing frozen travels

    lora.save_adapter(engine.model, tmp_path, str(tiny_model_dir))  # peft's own loader reads it
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    merged = PeftModel.from_pretrained(base, str(tmp_path)).merge_and_unload().state_dict()
    for name, tensor in sent.items():
        assert not torch.equal(tensor, AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).state_dict()[name])
        torch.testing.assert_close(tensor, merged[name])


def test_trainable_biases_travel_too(tiny_model_dir):
    _, engine, _, _ = _engine(tiny_model_dir, bias="all", target_modules=["q_proj"])
    names = [n for n, _ in weights_for_sync(engine, None)]
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert "model.layers.0.self_attn.k_proj.bias" in names  # trains (bias: all), so vLLM needs it
    assert not any("base_layer" in n or "lora_" in n for n in names)


def test_a_checkpoint_holds_the_adapter_and_resumes_it_with_its_optimizer(tiny_model_dir, tmp_path):
    cfg, engine, tok, _ = _engine(tiny_model_dir)
    _train_a_little(engine)
    state = TrainState(step=3, version=4, version_step=3, ledger=Ledger())
    saved = checkpoint.save(tmp_path, state, engine.model, tok, engine.optimizer, engine.scheduler)
    assert lora.is_adapter_dir(saved) and not (saved / "model.safetensors").exists()

    again, _, _ = build_engine(cfg, str(saved))
    assert checkpoint.restore_optimizer(saved, again.optimizer, again.scheduler)
    before, after = dict(weights_for_sync(engine, None)), dict(weights_for_sync(again, None))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    moments = [s["exp_avg"] for s in again.optimizer.state.values()]
    assert moments and all(m.abs().sum() > 0 for m in moments)


def test_a_checkpoint_of_another_adapter_shape_is_one_line(tiny_model_dir, tmp_path):
    _, engine, _, _ = _engine(tiny_model_dir)
    lora.save_adapter(engine.model, tmp_path, str(tiny_model_dir))
    with pytest.raises(ValueError, match="does not fit the peft config"):
        _engine(tiny_model_dir, tmp_path, r=8)
    with pytest.raises(ValueError, match="does not fit the peft config"):
        _engine(tiny_model_dir, tmp_path, target_modules=["q_proj", "k_proj", "v_proj"])


def test_target_modules_that_match_nothing_is_one_line(tiny_model_dir):
    with pytest.raises(StartupError, match=r"^peft\.target_modules=\['no_such_proj'\]"):
        _engine(tiny_model_dir, target_modules=["no_such_proj"])


def test_peft_config_keys_are_checked():
    cfg = AgrpoConfig(peft={"r": 16, "lora_alpha": 32, "target_modules": "all-linear"})
    assert cfg.peft is not None and cfg.peft.lora_kwargs()["r"] == 16
    with pytest.raises(ValueError, match="use_dora"):
        AgrpoConfig(peft={"use_dora": True})
    assert AgrpoConfig(peft={"r": 8}, trainer={"num_processes": 2}).peft is not None  # sharded LoRA: test_fsdp_lora.py


def test_agrpo_merge_writes_the_base_model_with_the_adapter_in(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from agrpo.cli import main as agrpo

    _, engine, tok, _ = _engine(tiny_model_dir)
    _train_a_little(engine)
    saved = checkpoint.save(tmp_path / "run", TrainState(step=1, version=2, version_step=1, ledger=Ledger()),
                            engine.model, tok, engine.optimizer, engine.scheduler)
    assert agrpo(["merge", str(saved), str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).state_dict()
    for name, tensor in weights_for_sync(engine, None):
        torch.testing.assert_close(merged[name], tensor)
    assert agrpo(["merge", str(tiny_model_dir), str(tmp_path / "x")]) == 2  # not a LoRA checkpoint: one line
