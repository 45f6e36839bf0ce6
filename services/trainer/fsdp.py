"""The trainer's Engine under torch FSDP2 (`fully_shard`): sharding and the weight-sync gather.

Layout (as benchmarks/gpu_fsdp2.py measured it): every decoder layer is its own FSDP
unit; the root unit is the Engine's `RootForward` wrapper, so it owns the embeddings,
the final norm and lm_head, and the Engine's one call into it (decoder + chunked-vocab
head) runs between its unshard and reshard. Build the optimizer *after* `shard_model`:
it must hold the sharded (DTensor) parameters.

Each process trains its own rows of every micro-batch (`Engine.my_rows`); the loss
scaling that makes this equal to single-process training is derived in
`Engine.row_loss`. Only the training maths is here; the service on N ranks (rank 0
serving gRPC, the others following its commands) is services/trainer/ranks.py.
"""

from __future__ import annotations

import torch

from .engine import Engine, RootForward, _decoder, _sharded
from .weight_sync.transports import hf_name


def shard_model(model: torch.nn.Module, mesh=None, mixed_precision: bool = False,
                cpu_offload: bool = False) -> RootForward:
    """fully_shard each decoder layer, then the RootForward root; returns the root.

    mixed_precision: bf16 unsharded parameters (forward/backward) with fp32 gradient
    reduction, the usual CUDA setting; the sharded master weights stay in their dtype.
    mesh: a 1-D mesh over all ranks (None: the default group); the Engine splits rows
    by the default group's rank and size. cpu_offload: FSDP2's CPUOffloadPolicy (sharded
    parameters, gradients and optimizer state in pinned CPU memory).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    root = model if isinstance(model, RootForward) else RootForward(model)
    kwargs = {} if mesh is None else {"mesh": mesh}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in _decoder(root.lm).layers:
        fully_shard(layer, **kwargs)
    fully_shard(root, **kwargs)
    return root


def _units(root: torch.nn.Module) -> list[torch.nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in root.modules() if isinstance(m, FSDPModule)]


def _bits(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits if dtype.is_floating_point else 64


def full_weights_for_sync(model: torch.nn.Module, dtype: torch.dtype | None = None, *,
                          dst: int | None = None, per_param: bool = False) -> list[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) pairs of the trainable parameters, as `named_weights` gives them
    single-device (`gather_full`: collective, and `dst` keeps them)."""
    return [(hf_name(n), t) for n, t in gather_full(model, dtype, dst=dst, per_param=per_param)]


@torch.no_grad()
def gather_full(model: torch.nn.Module, dtype: torch.dtype | None = None, *, dst: int | None = None,
                per_param: bool = False, frozen: bool = False) -> list[tuple[str, torch.Tensor]]:
    """(parameter name, full tensor) pairs of the trainable parameters, and of the frozen ones
    too with `frozen` (a LoRA model's base weights, for a merged sync).

    Gathered one FSDP unit at a time: `unshard()` is one all-gather per unit (the
    layer's whole flat shard), the unsharded parameters are copied out (cast to
    `dtype`), then `reshard()` frees them, so at most one unit is unsharded at once.
    With a bf16 mixed-precision policy the all-gather is already bf16; a tensor the
    policy holds in lower precision than asked for is gathered with `full_tensor()`
    instead. `per_param` forces `full_tensor()` for every tensor (the reference).
    Collective: every rank must call it. dst: only that rank keeps the tensors
    (others return []); None: every rank does.
    """
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    lm = model.lm if isinstance(model, RootForward) else model
    keep = dst is None or dist.get_rank() == dst
    sharded = [(n, p) for n, p in lm.named_parameters() if frozen or p.requires_grad]
    want = {n: (dtype or p.dtype) for n, p in sharded}
    out: dict[str, torch.Tensor | None] = {}  # None: gathered but not kept here
    low: set[str] = set()  # unsharded in lower precision than asked: full_tensor() below
    if not per_param:
        for unit in _units(model):
            unit.unshard()
            for name, p in lm.named_parameters():
                if name not in want or name in out or name in low or isinstance(p, DTensor):
                    continue
                if _bits(p.dtype) < _bits(want[name]):
                    low.add(name)
                else:
                    out[name] = p.detach().to(want[name], copy=True) if keep else None
            unit.reshard()
    result = []
    for name, p in sharded:
        if name in out:
            t = out[name]
        else:  # same order on every rank: full_tensor() is a collective
            t = p.full_tensor() if isinstance(p, DTensor) else p.detach()
            t = t.to(want[name], copy=True) if keep else None
        if keep:
            assert t is not None  # copied above whenever `keep`
            result.append((name, t.contiguous()))
    return result


def weights_for_sync(engine: Engine, dtype: torch.dtype | None = None, dst: int | None = None):
    """What a full-weight sync sends, sharded or not (single-device: `named_weights`); a LoRA
    model's adapted layers merged, since vLLM holds the base model. Sharded: collective."""
    from .lora import has_adapter, merged_weights
    from .weight_sync.transports import named_weights

    adapter = has_adapter(engine.model)
    if _sharded(engine.root) and adapter:  # every weight whole (in its own dtype), then merged
        whole = gather_full(engine.root, dst=dst, frozen=True)
        return merged_weights(engine.model, dtype, dict(whole)) if whole else []
    if _sharded(engine.root):
        return full_weights_for_sync(engine.root, dtype, dst=dst)
    if adapter:
        return merged_weights(engine.model, dtype)
    return named_weights(engine.model, dtype)


def adapter_for_sync(engine: Engine, dtype: torch.dtype | None = None, dst: int | None = None):
    """A LoRA model's adapter tensors under peft's file names (`lora.adapter_tensors`), gathered
    whole when sharded (collective; only `dst` gets them)."""
    from .lora import adapter_tensors

    if not _sharded(engine.root):
        return adapter_tensors(engine.model, dtype)
    whole = gather_full(engine.root, dst=dst)  # what trains: the adapter
    return adapter_tensors(engine.model, dtype, dict(whole)) if whole else []


def weights_to_save(engine: Engine, dst: int | None = 0):
    """What a checkpoint's model files hold: the adapter of a LoRA model, else the full weights."""
    from .lora import has_adapter

    return adapter_for_sync(engine, None, dst) if has_adapter(engine.model) else weights_for_sync(engine, None, dst)


def build_sharded_engine(cfg, model_path: str, mesh=None, mixed_precision: bool | None = None,
                         cpu_offload: bool | None = None):
    """engine_factory.build_engine for one FSDP2 rank: load, shard, then optimizer and scheduler.

    Call after `dist.init_process_group` (and torch.cuda.set_device on GPU).
    mixed_precision None: on where training runs on CUDA; cpu_offload None: trainer.cpu_offload.
    """
    from .engine_factory import build_engine
    from .model import pick_device

    mp = pick_device(cfg).type == "cuda" if mixed_precision is None else mixed_precision
    offload = cfg.trainer.cpu_offload if cpu_offload is None else cpu_offload
    return build_engine(cfg, model_path,
                        shard=lambda model: shard_model(model, mesh, mixed_precision=mp, cpu_offload=offload))
