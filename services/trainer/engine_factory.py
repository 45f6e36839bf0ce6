"""Model, tokenizer and Engine (optimizer, scheduler, loss) from a config: the one recipe that
the trainer's ranks, the FSDP2 helpers, the tests and the benchmarks all build with. A leaf
below the loop and the ranks, so neither has to import the other to build an engine."""

from __future__ import annotations

import random

import torch

from agrpo.services.common.config import AgrpoConfig

from . import lora
from .engine import Engine, EngineConfig
from .loss import LossConfig
from .model import autocast_dtype, build_optimizer, build_scheduler, load_model, pick_device

CPU_TREE_MIN_PARAMS = 10_000_000
"""trainer.forward auto on a CPU: the tree for a model at least this big. There the matmuls fill
the step and the tree computes a group's shared prompt once (SmolLM2-135M: forward and backward
1.5-2.2x faster); a smaller model's step is op overhead, which the dense tree mask adds to (the
0.5M-parameter demo model: 9% slower to reward 0.9). docs/vs-trl.md, "smollm2"."""


def tree_forward(forward: str, device: torch.device, model: torch.nn.Module) -> bool:
    """trainer.forward resolved: tree or unpacked rows (auto: tree on a GPU, and on a CPU for a
    model of CPU_TREE_MIN_PARAMS or more)."""
    if forward != "auto":
        return forward == "tree"
    return device.type == "cuda" or sum(p.numel() for p in model.parameters()) >= CPU_TREE_MIN_PARAMS


def build_engine(cfg: AgrpoConfig, model_path: str, shard=None):
    """Model, tokenizer and Engine (optimizer + scheduler) for a model path.

    shard: applied to the loaded model before the optimizer is built (it must hold the
    sharded parameters), e.g. `fsdp.shard_model`; the Engine gets what it returns.
    """
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg)
    if cfg.peft is not None:  # the base model, then the adapter (a checkpoint's, when resuming)
        adapter = model_path if lora.is_adapter_dir(model_path) else None
        model, tokenizer = load_model(cfg, cfg.model or model_path, device)  # the base: a checkpoint holds only the adapter
        model = lora.attach(model, cfg.peft, adapter)
    else:
        model, tokenizer = load_model(cfg, model_path, device)
    root = shard(model) if shard is not None else model
    optimizer = build_optimizer(cfg, model)
    scheduler = build_scheduler(cfg, optimizer)
    mode, clip_min, clip_max = cfg.importance_sampling
    loss = LossConfig(cfg.epsilon, cfg.effective_epsilon_high, cfg.temperature, is_mode=mode, is_min=clip_min,
                      is_max=clip_max)
    tree = tree_forward(cfg.trainer.forward, device, model)
    engine = Engine(root, optimizer, scheduler,
                    EngineConfig(loss, cfg.max_grad_norm, tree=tree, autocast=autocast_dtype(cfg, device),
                                 router_aux_loss_coef=cfg.router_aux_loss_coef,
                                 fp32_head=cfg.cast_lm_head_to_fp32, compile_layers=cfg.compiles,
                                 compile_head=cfg.compiles, device=device))
    return engine, tokenizer, device
