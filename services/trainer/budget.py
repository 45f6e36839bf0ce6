"""The default token budget of a row (token_budget None): as many tokens as the trainer's memory holds.

The budget bounds memory, never what a step trains (gathering.py): a step's samples are cut into as
many micro-batches as they need. A row's memory grows with its tokens: the decoder's saved
activations (all of every layer, or each layer's input alone under gradient checkpointing plus one
layer recomputed in backward) and the chunked-vocab head's transient logits per loss term
(loss.chunked_logprobs). The free memory is the device's (CUDA: free plus what torch's allocator
caches; CPU: the host's available memory) less what the first step still allocates: gradients and,
unless a checkpoint restored it, AdamW's two moments. Overestimates on purpose (an OOM stops the run;
a smaller row costs a little speed): the element counts of an eager layer, 80% of the free memory.
TRL's own default, the vLLM server's max_model_len, stays the floor, so no sample the server can
produce is ever too long for a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

USABLE_SHARE = 0.8
"""Of the free memory, the share rows may use (the allocator fragments; compiles take workspace)."""
RESERVE_BYTES = 1 << 30
"""Kept free besides: CUDA graphs, kernels' workspaces, the loss diagnostics."""
GPU_MAX_ROW = 65_536
"""The longest default row on a GPU: past it a step's forward is already a few seconds of compute."""
CPU_MAX_ROW = 4096
"""The longest default row off CUDA: engine.DENSE_ROW_MAX, past which a tree row goes unpacked."""


@dataclass(frozen=True)
class RowShape:
    """What a row's memory per token depends on."""

    layers: int
    hidden: int
    intermediate: int
    kv_hidden: int
    vocab: int
    act_bytes: int
    """Bytes of an activation: 2 under bf16/fp16 autocast or half weights, else 4."""
    recompute: bool
    """Gradient checkpointing: each layer keeps its input only, one layer is recomputed at a time."""
    vocab_chunk: int = 32768

    @property
    def layer_bytes(self) -> int:
        """One layer's saved activations per token: norms' inputs in fp32, the projections'
        inputs and outputs, attention's q, k, v and output, the MLP's gate, up, activation and
        product, with eager autocast's casts (an eager Qwen2.5-1.5B-shaped layer saved 136 KiB a
        token on an H100, docs/vs-trl.md; a compiled one saves about half)."""
        elements = 12 * self.hidden + 2 * self.kv_hidden + 6 * self.intermediate
        return elements * self.act_bytes + 2 * self.hidden * 4

    @property
    def head_bytes(self) -> int:
        """The head's transient per loss term: one vocab chunk of logits, in the activation dtype,
        in fp32, and its gradient in backward."""
        return min(self.vocab, self.vocab_chunk) * (self.act_bytes + 8)

    @property
    def bytes_per_token(self) -> int:
        decoder = (self.layers * self.hidden * self.act_bytes + self.layer_bytes if self.recompute
                   else self.layers * self.layer_bytes)
        return decoder + self.head_bytes


def row_budget(shape: RowShape, free_bytes: int, floor: int, cap: int) -> tuple[int, int]:
    """(budget, tokens the memory holds): the tokens `free_bytes` holds, at most `cap`, at least
    `floor` (the longest sample there can be)."""
    fits = max(0, int(free_bytes * USABLE_SHARE) - RESERVE_BYTES) // shape.bytes_per_token
    return max(floor, min(cap, fits)), fits


def shape_of(model: torch.nn.Module, act_bytes: int, recompute: bool, vocab_chunk: int) -> RowShape:
    """The row shape of a Hugging Face causal LM (its text config)."""
    cfg = getattr(model.config, "text_config", None) or model.config
    hidden = int(cfg.hidden_size)
    heads = int(getattr(cfg, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    intermediate = int(getattr(cfg, "intermediate_size", None) or 4 * hidden)
    return RowShape(layers=int(cfg.num_hidden_layers), hidden=hidden, intermediate=intermediate,
                    kv_hidden=kv_heads * head_dim, vocab=int(cfg.vocab_size), act_bytes=act_bytes,
                    recompute=recompute, vocab_chunk=vocab_chunk)


def free_bytes(device: torch.device) -> int:
    """Memory the trainer can still take on `device`."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return _host_available()


def _host_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 4 << 30


def first_step_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> int:
    """What the first step allocates besides activations on `device`: each trainable parameter's
    gradient, and AdamW's two moments unless the optimizer already holds state."""
    fresh = not optimizer.state
    total = 0
    for p in model.parameters():
        if not p.requires_grad or p.device != device:
            continue
        local = p.to_local() if hasattr(p, "to_local") else p  # an FSDP2 shard: this rank's part
        total += local.numel() * local.element_size() * (3 if fresh else 1)
    return total


def engine_budget(engine, recompute: bool, floor: int) -> tuple[int, int]:
    """row_budget for an Engine's model, optimizer and device, its activations in the weights'
    dtype (fp32 weights under bf16 autocast keep an fp32 residual stream: counted as fp32)."""
    weight = next(engine.model.parameters())
    shape = shape_of(engine.model, weight.element_size(), recompute, engine.cfg.vocab_chunk)
    free = free_bytes(engine.device) - first_step_bytes(engine.model, engine.optimizer, engine.device)
    cap = GPU_MAX_ROW if engine.device.type == "cuda" else CPU_MAX_ROW
    return row_budget(shape, free, floor, cap)
