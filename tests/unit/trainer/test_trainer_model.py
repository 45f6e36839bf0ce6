"""Optimizer and schedule from the config: TRL defaults, CPU fallbacks, warmup."""

from __future__ import annotations

import pytest
import torch

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.trainer.model import build_optimizer, build_scheduler, load_dtype, warmup_steps


def _model():
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))


def _learning_rates(cfg, steps: int, opt=None) -> list[float]:
    """The learning rate each of `steps` optimizer steps runs with."""
    opt = opt or build_optimizer(cfg, _model())
    sched = build_scheduler(cfg, opt)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def test_defaults_constant_lr_and_fused_adamw_on_the_cpu_too():
    cfg = AgrpoConfig()
    opt = build_optimizer(cfg, _model())
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults.get("fused")  # torch has the CPU kernel
    assert _learning_rates(cfg, 3, opt) == [1e-6] * 3
    plain = build_optimizer(AgrpoConfig(optim="adamw_torch"), _model())
    assert not plain.defaults.get("fused")


def test_weight_decay_skips_norms_and_biases():
    opt = build_optimizer(AgrpoConfig(weight_decay=0.1), _model())
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and len(decay["params"]) == 1  # only the Linear weight
    assert no_decay["weight_decay"] == 0.0 and len(no_decay["params"]) == 3


def test_warmup_then_linear_decay():
    cfg = AgrpoConfig(learning_rate=1.0, lr_scheduler_type="linear", max_steps=10, warmup_steps=0.2)
    assert warmup_steps(cfg, 10) == 2
    lrs = _learning_rates(cfg, 4)
    assert lrs[0] == 0.0 and lrs[2] == pytest.approx(1.0) and lrs[3] < 1.0


def test_constant_with_warmup_when_warmup_given():
    cfg = AgrpoConfig(learning_rate=1.0, warmup_steps=2)
    assert _learning_rates(cfg, 4) == [0.0, 0.5, 1.0, 1.0]


def test_half_precision_falls_back_to_fp32_on_cpu():
    assert load_dtype(AgrpoConfig(dtype="bfloat16"), torch.device("cpu")) == torch.float32
    assert load_dtype(AgrpoConfig(), torch.device("cpu")) == torch.float32
