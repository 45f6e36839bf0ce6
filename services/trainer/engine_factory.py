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
    tree = cfg.trainer.forward == "tree" or (cfg.trainer.forward == "auto" and device.type == "cuda")
    engine = Engine(root, optimizer, scheduler,
                    EngineConfig(loss, cfg.max_grad_norm, tree=tree, autocast=autocast_dtype(cfg, device),
                                 router_aux_loss_coef=cfg.router_aux_loss_coef,
                                 fp32_head=cfg.cast_lm_head_to_fp32, compile_layers=cfg.compiles,
                                 compile_head=cfg.compiles, device=device))
    return engine, tokenizer, device
