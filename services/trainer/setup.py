"""Assemble a TrainerLoop from the config: model (or latest checkpoint), optimizer,
scheduler, engine, weight transport and syncer, step logger. Blocking (runs in a thread).
"""

from __future__ import annotations

import torch

from agrpo.services.common import weight_transports
from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.logging import get_logger
from agrpo.services.common.preflight import StartupError

from . import checkpoint, lora
from .loop import TrainerLoop
from .metrics import StepLogger
from .weight_sync import WeightSyncer
from .weight_sync.adapter_sync import AdapterPlan, AdapterSync
from .weight_sync.base import WeightTransport

log = get_logger("trainer.setup")


def make_transport(cfg: AgrpoConfig, device: torch.device) -> WeightTransport:
    """The registered transport the config names (services/common/weight_transports.py);
    auto: NCCL when training on a GPU, HTTP on CPU."""
    kind = cfg.trainer.weight_transport
    if kind == "auto":
        kind = "nccl" if device.type == "cuda" else "http"
    cls: type[WeightTransport] = weight_transports.load(kind)
    if cls.needs_gpu and device.type != "cuda":  # a config error, not the model's
        raise StartupError(f"trainer.weight_transport={kind} needs the trainer on a GPU (it trains on {device})")
    return cls.from_config(cfg, device)


def local_syncer(cfg: AgrpoConfig, model: torch.nn.Module, tokenizer):
    """The trainer's own generator (weight_transport local), stopping where vLLM would: at the
    generation config's EOS tokens and the tokenizer's."""
    from .weight_sync.local import LocalSyncer

    eos = getattr(model.generation_config, "eos_token_id", None)
    stops = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        stops.add(tokenizer.eos_token_id)
    limit = getattr(model.config, "max_position_embeddings", None)
    return LocalSyncer(cfg.vllm_urls[0], model, stops, cfg.max_model_len_for(limit), str(cfg.model), cfg.seed)


def adapter_sync(cfg: AgrpoConfig, model: torch.nn.Module, transport: WeightTransport) -> AdapterSync | None:
    """A LoRA trainer's adapter-only sync (decided against the servers at the first sync)."""
    if cfg.peft is None:
        return None
    plan = AdapterPlan(lora.adapter_config_json(model, cfg.model), cfg.peft.r, cfg.adapter_slots,
                       lora.adapter_sync_blocker(model, cfg.peft))
    return AdapterSync(plan, transport, cfg.trainer.http_chunk_mb, cfg.trainer.lora_sync)


def build_loop(app) -> TrainerLoop:
    """Everything the loop needs; the model (and optimizer) from `app.resumed_from` when
    the app restored its state from that checkpoint, on every rank (app.ranks)."""
    cfg, ckpt = app.cfg, app.resumed_from
    if not cfg.model:
        raise ValueError("trainer needs `model` (a path or id)")
    shards = ckpt / checkpoint.SHARDS if ckpt is not None else None
    shards = str(shards) if shards is not None and shards.exists() else None
    engine, tokenizer, device = app.ranks.build(cfg, str(ckpt) if ckpt else cfg.model, shards)
    if ckpt is not None and shards is None and not checkpoint.restore_optimizer(ckpt, engine.optimizer,
                                                                                  engine.scheduler):
        log.warning("%s holds no optimizer state (save_only_model): optimizer starts fresh", ckpt)
    if cfg.trainer.weight_transport == "local":
        syncer = local_syncer(cfg, engine.model, tokenizer)
    else:
        transport = make_transport(cfg, device)
        syncer = WeightSyncer(cfg.vllm_urls, transport, cfg.weight_sync_phase_timeout, cfg.weight_sync_timeout,
                              load_mode=cfg.trainer.weight_load, recompute_in_flight=cfg.trainer.recompute_in_flight,
                              swap=cfg.trainer.weight_swap, adapters=adapter_sync(cfg, engine.model, transport))
    step_log = StepLogger(app.metrics_file, cfg.logging_steps, cfg.report_to, cfg.run_name, cfg.logging_dir, cfg.project)
    return TrainerLoop(cfg, engine, tokenizer, syncer, app.state, app.buffer, app.intake, app.board,
                       app.metrics, step_log, app.record, app.ranks)
