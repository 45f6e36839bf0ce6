"""Model, tokenizer, optimizer and LR schedule from the config (TRL's defaults).

Why the dtype rules: on CPU bf16 matmuls are slow or unsupported, so the model trains
in fp32 there (cfg.dtype wins where the platform supports it; autocast bf16 only on
CUDA). Fused AdamW (transformers' default optim, as TRL gets it) also on the CPU, where torch
has the kernel: a fifth of the plain optimizer's time.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.logging import get_logger

log = get_logger("trainer.model")

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
           "float64": torch.float64}


def pick_device(cfg: AgrpoConfig) -> torch.device:
    """CUDA when present (unless use_cpu), else CPU."""
    if torch.cuda.is_available() and not cfg.use_cpu:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def load_dtype(cfg: AgrpoConfig, device: torch.device) -> torch.dtype | str:
    """cfg.dtype (model_init_kwargs['dtype'] wins); half precision only off CPU, float64 only on it."""
    name = (cfg.model_init_kwargs or {}).get("dtype", cfg.dtype)
    if name == "auto":
        return "auto" if device.type != "cpu" else torch.float32
    dtype = _DTYPES[name] if isinstance(name, str) else name
    if device.type == "cpu" and dtype not in (torch.float32, torch.float64):
        log.warning("dtype %s requested on CPU: training in float32", dtype)
        return torch.float32
    return dtype


def autocast_dtype(cfg: AgrpoConfig, device: torch.device) -> torch.dtype | None:
    """bf16 autocast where supported (CUDA), fp16 if asked; None on CPU."""
    if device.type != "cuda":
        return None
    if cfg.fp16:
        return torch.float16
    if cfg.bf16 is False:
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else None


def load_model(cfg: AgrpoConfig, path: str, device: torch.device):
    """HF causal LM + tokenizer, training mode, gradient checkpointing as configured."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = dict(cfg.model_init_kwargs or {})
    kwargs["dtype"] = load_dtype(cfg, device)
    kwargs.setdefault("trust_remote_code", cfg.trust_remote_code)
    kwargs.setdefault("attn_implementation", "sdpa")
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device)
    model.config.use_cache = cfg.use_cache
    if cfg.gradient_checkpointing:
        gc_kwargs = cfg.gradient_checkpointing_kwargs or {"use_reentrant": False}
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gc_kwargs)
    model.train()
    tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer or path, trust_remote_code=cfg.trust_remote_code)
    return model, tokenizer


def _optim_args(text: str | None) -> dict[str, float]:
    if not text:
        return {}
    pairs = (kv.split("=", 1) for kv in text.split(",") if kv.strip())
    return {k.strip(): float(v) for k, v in pairs}


def build_optimizer(cfg: AgrpoConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW (fused where the device allows), SGD or Adafactor; decay skips norms and biases."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    extra = _optim_args(cfg.optim_args)
    lr = cfg.learning_rate
    if cfg.optim == "sgd":
        return torch.optim.SGD(groups, lr=lr, **extra)
    if cfg.optim == "adafactor":
        return torch.optim.Adafactor(groups, lr=lr, **extra)
    fused = cfg.optim == "adamw_torch_fused"
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                 eps=cfg.adam_epsilon, fused=fused or None, **extra)
    except RuntimeError:  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, lr=lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                 eps=cfg.adam_epsilon, **extra)


def warmup_steps(cfg: AgrpoConfig, total: int) -> int:
    """warmup_steps (a fraction < 1 of total) or warmup_ratio."""
    if cfg.warmup_steps >= 1:
        return int(cfg.warmup_steps)
    ratio = cfg.warmup_steps or (cfg.warmup_ratio or 0.0)
    return math.ceil(ratio * total) if total > 0 else 0


def build_scheduler(cfg: AgrpoConfig, optimizer: torch.optim.Optimizer):
    """transformers' scheduler by name; constant by default (step count unknown)."""
    from transformers import get_scheduler

    total = cfg.max_steps if cfg.max_steps > 0 else 0
    name = cfg.lr_scheduler_type
    warm = warmup_steps(cfg, total)
    if name == "constant" and warm > 0:
        name = "constant_with_warmup"
    return get_scheduler(name, optimizer, num_warmup_steps=warm,
                         num_training_steps=total or None,
                         scheduler_specific_kwargs=cfg.lr_scheduler_kwargs or {})
