"""Forward/backward of packed micro-batches and the optimizer step (blocking; run in a thread).

Tree forward: a row's unique tokens go through the decoder once, with RoPE positions
= trie depth and attention restricted to each token's ancestors (its own sample's
prefix). On CUDA the relation is a flex_attention BlockMask over the pre-order
intervals `subtree_end` (services/trainer/tree_attention.py; rows padded to the 128-token
block), and on one GPU the decoder layers and the logprob head are torch.compile'd too;
elsewhere (and with `attention="sdpa"`) it is a dense boolean [N, N] mask to SDPA, exact
on every device and O(N^2) in memory. The unpacked path forwards each sample as its own
padded row; all give the same per-term logprobs (tests/unit/trainer/test_trainer_engine.py,
tests/unit/trainer/test_tree_attention.py, tests/gpu/test_gpu_train.py).

Every use of a parameter (decoder and the chunked-vocab head) runs inside one call of
`RootForward`, the module FSDP2 shards as its root (services/trainer/fsdp.py), so its
hooks unshard the embeddings, final norm and lm_head around it. Under FSDP2 each rank
trains its own rows of every micro-batch; see `Engine.row_loss` for the loss scaling.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from itertools import pairwise

import torch

from agrpo.services.common.heap import release_free_heap

from . import tree_attention
from .loss import (
    LossConfig,
    at_least_fp32,
    chunked_logprobs,
    materialize,
    normalised_loss,
    per_term_loss,
    policy_stat_tensors,
)
from .packing import MicroBatch, PackedRow
from .row_inputs import to_device


def _decoder(model):
    return getattr(model, model.base_model_prefix)


def _moe_aux(model):
    """(load_balancing_loss_func, num_experts, top_k) for MoE models, else None."""
    import sys

    cfg = model.config
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    fn = getattr(sys.modules.get(type(model).__module__), "load_balancing_loss_func", None)
    if not experts or fn is None:
        return None
    return fn, experts, getattr(cfg, "num_experts_per_tok", 2)


class RootForward(torch.nn.Module):
    """Holds the causal LM (`lm`); its forward runs a closure over it.

    Single device it is a pass-through. Under FSDP2 it is the root unit: calling it
    runs the root's pre-forward hook (unshard embeddings/norm/head) before the closure
    and registers the pre-backward hook on the closure's outputs, so the head weight
    used by the chunked logprobs (forward and checkpointed backward) is unsharded.
    """

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, fn):
        return fn()


def _sharded(module: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return isinstance(module, FSDPModule)


DENSE_ROW_MAX = 4096
"""Eager layers (attention auto): a tree row up to this long attends through the dense SDPA mask
(16 MiB of bools at most). flex_attention's kernel is compiled, seconds on the first step and
again as row lengths change, which a short run never repays and a short row does not need.
Off CUDA (no flex) a longer row goes as its padded samples instead."""


@dataclass
class EngineConfig:
    """Loss settings plus how the forward runs.

    attention: how tree rows attend. auto = flex (BlockMask) on CUDA, dense-mask SDPA
    elsewhere, and also on CUDA for a row of at most DENSE_ROW_MAX tokens when the layers run
    eager; "flex" on CPU runs flex eagerly (tests); "sdpa" forces the dense mask.
    compile_layers / compile_head: torch.compile each decoder layer (flex path) and the
    chunked-vocab logprobs (same maths, the fp32 logit passes fused). CUDA and a single
    process only: eager, the step is bound by kernel launches and memory-bound passes
    (docs/gpu.md); under FSDP2 on one rank they compile too, which is faster than unsharded
    with fp32 master weights (docs/multi-gpu.md, "Memory for bigger models").
    device: where compute runs; None: the parameters' device (FSDP2's CPU offload keeps
    them on the CPU while compute runs on the GPU).
    """

    loss: LossConfig
    max_grad_norm: float = 1.0
    tree: bool = True
    vocab_chunk: int = 32768
    autocast: torch.dtype | None = None
    router_aux_loss_coef: float | None = None  # None: the model config's coefficient
    fp32_head: bool = False
    """Project the final hidden states with an fp32 LM head (cast_lm_head_to_fp32)."""
    attention: str = "auto"
    compile_layers: bool = True
    compile_head: bool = True
    device: torch.device | None = None


class Engine:
    """Owns the model and optimizer; `train_step` runs one optimizer step.

    `model` is the HF causal LM, or a `RootForward` sharded by `fsdp.shard_model`
    (then this rank trains rows rank, rank + world, ... of every micro-batch).
    `self.model` is always the HF model (HF parameter names, config).
    """

    def __init__(self, model, optimizer, scheduler, cfg: EngineConfig) -> None:
        self.root = model if isinstance(model, RootForward) else RootForward(model)
        model = self.root.lm
        self.model, self.optimizer, self.scheduler, self.cfg = model, optimizer, scheduler, cfg
        self.world, self.rank = 1, 0
        if _sharded(self.root):
            import torch.distributed as dist

            self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.device = cfg.device or next(model.parameters()).device
        self.moe = _moe_aux(model)
        self.aux_coef = cfg.router_aux_loss_coef
        if self.aux_coef is None:
            self.aux_coef = getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0
        self.last_aux: torch.Tensor | None = None
        self.staleness: Callable[[int], int] | None = None  # set by train_step, for diagnostics
        self.flex = _use_flex(cfg.attention, self.device)
        compiled = self.device.type == "cuda" and self.world == 1
        layers_compiled = self.flex and cfg.compile_layers and compiled
        if self.flex:
            tree_attention.install(model)
            if layers_compiled:
                tree_attention.compile_layers(_decoder(model))
        self.dense_up_to = _dense_up_to(cfg.attention, layers_compiled)
        self.logprobs = torch.compile(chunked_logprobs) if cfg.compile_head and compiled else chunked_logprobs

    def _autocast(self):
        if self.cfg.autocast is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.cfg.autocast)

    def _tree(self, row: PackedRow, tree: bool | None) -> bool:
        """Whether this row goes through the tree forward (None: the config's choice)."""
        tree = self.cfg.tree if tree is None else tree
        if tree and self.device.type != "cuda" and row.num_tokens > DENSE_ROW_MAX:
            return False  # no flex off CUDA, and the dense mask's attention grows with the row squared
        return tree

    def _flex(self, row: PackedRow) -> bool:
        return self.flex and row.num_tokens > self.dense_up_to

    def row_inputs(self, row: PackedRow, tree: bool, lags: list[int] | None = None) -> dict[str, torch.Tensor]:
        """Everything of the row that its forward and loss read, on the device, before any of
        it is launched (row_inputs.py says why). Tree rows on flex are padded to whole blocks
        (pads are never attended, never read); `lags` adds the per-term staleness."""
        ints: dict = {"labels": row.labels, "segment": row.segment_id}
        if tree:
            ids, pos, end = row.input_ids, row.position_ids, row.subtree_end
            if self._flex(row):
                ids, pos, end = tree_attention.pad_tree(ids, pos, end, tree_attention.padded_length(len(ids)))
            ints.update(ids=ids, pos=pos, end=end, token_index=row.token_index)
        else:
            ints.update(_padded(row), sample_position=row.sample_position)
        if lags is not None:
            ints["staleness"] = lags
        return to_device(self.device, ints, {"old": row.old_logprobs, "adv": row.advantages})

    def row_hidden(self, row: PackedRow, x: dict[str, torch.Tensor], tree: bool) -> torch.Tensor:
        """Final hidden states at the row's term positions, [M, H] (x: its `row_inputs`)."""
        if tree:
            end = x["end"]
            mask = tree_attention.block_mask(end) if self._flex(row) else tree_attention.dense_mask(end)[None, None]
            out = self._decode(input_ids=x["ids"][None], position_ids=x["pos"][None], attention_mask=mask)
            n = end.shape[0]
            real = None if n == row.num_tokens else torch.arange(n, device=self.device) < row.num_tokens
            self._router_aux(out, None if real is None else real[None].long())  # pads stay out of the balance
            return out.last_hidden_state[0][x["token_index"]]
        out = self._decode(input_ids=x["ids"], attention_mask=x["att"])
        self._router_aux(out, x["att"])
        return out.last_hidden_state[x["segment"], x["sample_position"]]

    def _decode(self, **inputs):
        if self.moe is not None:
            inputs["output_router_logits"] = True
        return _decoder(self.model)(use_cache=False, **inputs)

    def _router_aux(self, out, mask2d) -> None:
        """MoE load-balancing loss of this forward (kept for row_loss), as HF computes it."""
        self.last_aux = None
        if self.moe is None or getattr(out, "router_logits", None) is None:
            return
        fn, experts, top_k = self.moe
        self.last_aux = fn(out.router_logits, experts, top_k, mask2d)

    def row_logprobs(self, row: PackedRow, tree: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-term log-probabilities of the labels (at temperature) and entropies."""
        tree = self._tree(row, tree)
        return self._logprobs(row, self.row_inputs(row, tree), tree)

    def _logprobs(self, row: PackedRow, x: dict[str, torch.Tensor], tree: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return self.root(partial(self._row_logprobs, row, x, tree))

    def _row_logprobs(self, row: PackedRow, x: dict[str, torch.Tensor], tree: bool) -> tuple[torch.Tensor, torch.Tensor]:
        with self._autocast():
            hidden = self.row_hidden(row, x, tree)
        head = self.model.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        if self.cfg.fp32_head:  # logits in fp32 (GRPOConfig's cast_lm_head_to_fp32): less mismatch
            hidden, weight = at_least_fp32(hidden), at_least_fp32(weight)
            bias = None if bias is None else at_least_fp32(bias)
        return self.logprobs(hidden, weight, x["labels"], self.cfg.loss.temperature, self.cfg.vocab_chunk, bias)

    def row_loss(self, row: PackedRow, step_terms: int, world: int, micro_batches: int = 1,
                 rows_per_rank: float | None = None):
        """Normalised loss of one row plus its diagnostics.

        `world` is P, the micro-batch's rows (TRL's ranks); `step_terms` counts the loss terms of
        the whole optimizer step. Single process every row stands for one rank and is divided by
        P, as DDP's gradient mean would. Under FSDP2 over W processes (rows_per_rank = P / W), the
        reduce-scatter already divides by W, so a row is divided by P / W only:
            (1/W) * sum_r (W/P) * g_r = (1/P) * sum_r g_r,
        the single-process gradient. With normalised_loss's sum_t l_t / (T / P) that is the sum
        over all T terms of the step / T, however many micro-batches carry them. The MoE aux loss
        is a mean over the step's rows (`micro_batches` x P).
        """
        rows_per_rank = world if rows_per_rank is None else rows_per_rank
        tree, lags = self._tree(row, None), self._lags(row)
        x = self.row_inputs(row, tree, lags)
        logp, entropy = self._logprobs(row, x, tree)
        old, adv, segment = x["old"], x["adv"], x["segment"]
        per, _ = per_term_loss(logp, old, adv, self.cfg.loss, segment)
        loss = normalised_loss(per, step_terms, world) / rows_per_rank
        levels = None if lags is None else sorted(set(lags))
        stats = policy_stat_tensors(logp.detach(), old, adv, entropy, segment, self.cfg.loss, x.get("staleness"), levels)
        if self.last_aux is not None and self.aux_coef:
            loss = loss + self.aux_coef * self.last_aux / micro_batches / rows_per_rank
            stats["aux_loss"] = (self.last_aux.detach(), 1.0)
        return loss, stats

    def _lags(self, row: PackedRow) -> list[int] | None:
        """Per term: how far behind the trainer its sample's version is (None when unknown)."""
        if self.staleness is None or not row.samples:
            return None
        lag = [self.staleness(s.policy_version) for s in row.samples]
        return [lag[i] for i in row.segment_id]

    def my_rows(self, mb: MicroBatch) -> list[PackedRow]:
        """This process's rows of a micro-batch (all of them single process)."""
        if self.world == 1:
            return mb.rows
        if len(mb.rows) % self.world:
            raise ValueError(f"a micro-batch of {len(mb.rows)} rows cannot be split over {self.world} ranks")
        return mb.rows[self.rank::self.world]

    def train_step(self, batches: list[MicroBatch],
                   staleness: Callable[[int], int] | None = None) -> dict[str, float]:
        """Forward/backward every micro-batch, clip, step optimizer and scheduler. `staleness`
        (policy version -> distance to the trainer's) adds the mismatch by staleness."""
        self.staleness = staleness
        clock = StepClock(self.device)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        # The loss and the diagnostics stay on the device until the optimizer step is queued:
        # one read per step, so the GPU never waits on the CPU between forward and backward.
        total = torch.zeros((), device=self.device)
        stats: dict = {}
        step_terms = sum(mb.num_terms for mb in batches)
        for mb in batches:
            world = len(mb.rows)
            for row in self.my_rows(mb):
                loss, row_stats = self.row_loss(row, step_terms, world, len(batches), world / self.world)
                loss.backward()
                total = total + loss.detach() / self.world  # this row's share of the single-process loss
                _merge(stats, row_stats)
        if self.world > 1:
            read = materialize({"loss": total, **stats})
            total, stats = _gather_stats(read.pop("loss"), read)
        clock.mark()
        grad_norm = self._clip()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)  # nothing reads them after the step: free them now
        clock.mark()
        read = materialize({"loss": total, "grad_norm": grad_norm, **stats})
        if self.device.type == "cpu":
            release_free_heap()
        forward_backward, optimizer = clock.spans()
        out = {"loss": read.pop("loss"), "grad_norm": read.pop("grad_norm"), "learning_rate": lr,
               "perf/forward_backward_s": forward_backward, "perf/optimizer_s": optimizer}
        if self.device.type == "cuda":  # what the token budget is sized against (budget.py)
            out["perf/peak_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        out.update(_reduce(read))
        return out

    def _clip(self) -> torch.Tensor | float:
        """The gradients' global norm (a device tensor single process: read with the step's stats)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.world > 1:
            return _clip_sharded(params, self.cfg.max_grad_norm)
        if not params:
            return 0.0
        if self.cfg.max_grad_norm and self.cfg.max_grad_norm > 0:
            return torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))

    @torch.no_grad()
    def eval_loss(self, batches: list[MicroBatch]) -> float:
        """The step's loss without updating anything (tests, diagnostics)."""
        total = 0.0
        step_terms = sum(mb.num_terms for mb in batches)
        for mb in batches:
            for row in self.my_rows(mb):
                loss, _ = self.row_loss(row, step_terms, len(mb.rows), len(batches),
                                        len(mb.rows) / self.world)
                total += loss.item() / self.world
        if self.world > 1:
            total, _ = _gather_stats(total, {})
        return total


class StepClock:
    """Points in a step on the device's own timeline: CUDA events, so timing needs no sync
    mid-step (the GPU keeps its queue); the wall clock elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.points: list = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.points.append(event)
        else:
            self.points.append(time.perf_counter())

    def spans(self) -> list[float]:
        """Seconds between consecutive marks (waits for the last one on a GPU)."""
        if self.cuda:
            self.points[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in pairwise(self.points)]
        return [b - a for a, b in pairwise(self.points)]


def _padded(row: PackedRow) -> dict[str, torch.Tensor]:
    """The unpacked path's inputs: every sample its own row, right-padded, and its attention mask."""
    longest = max(len(s) for s in row.samples)
    ids = torch.zeros(len(row.samples), longest, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, s in enumerate(row.samples):
        ids[i, :len(s)] = torch.tensor(s.input_ids)
        att[i, :len(s)] = 1
    return {"ids": ids, "att": att}


def _use_flex(attention: str, device: torch.device) -> bool:
    """auto: flex_attention on CUDA (the compiled kernel); the dense SDPA mask elsewhere."""
    if attention not in ("auto", "flex", "sdpa"):
        raise ValueError(f"attention must be auto, flex or sdpa, not {attention!r}")
    if attention == "auto":
        return device.type == "cuda"
    return attention == "flex"


def _dense_up_to(attention: str, layers_compiled: bool) -> int:
    """The longest tree row that takes the dense SDPA mask where flex is in use: auto, eager layers."""
    return DENSE_ROW_MAX if attention == "auto" and not layers_compiled else 0


def _clip_sharded(params: list[torch.Tensor], max_norm: float) -> float:
    """Global grad norm of DTensor grads (and clip to it): the norm is made whole first."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params]
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm and max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def _gather_stats(total: float, stats: dict) -> tuple[float, dict]:
    """Every rank's loss share and diagnostics, merged as one process would have."""
    import torch.distributed as dist

    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (total, stats))
    merged: dict = {}
    for _, s in parts:
        _merge(merged, s)
    return sum(t for t, _ in parts), merged


def _merge(acc: dict, stats: dict) -> None:
    """Sum (numerator, denominator) pairs, keep extrema; tensors stay tensors (no read)."""
    for k, v in stats.items():
        if isinstance(v, tuple):
            num, den = acc.get(k, (0.0, 0.0))
            acc[k] = (num + v[0], den + v[1])
        elif k not in acc:
            acc[k] = v
        elif isinstance(v, torch.Tensor) or isinstance(acc[k], torch.Tensor):
            pick = torch.minimum if k.endswith(("_min", "/min")) else torch.maximum
            acc[k] = pick(torch.as_tensor(acc[k]), torch.as_tensor(v))
        else:
            acc[k] = min(acc[k], v) if k.endswith(("_min", "/min")) else max(acc[k], v)


def _reduce(acc: dict) -> dict[str, float]:
    out = {}
    for k, v in acc.items():
        out[k] = (v[0] / v[1] if v[1] else float("nan")) if isinstance(v, tuple) else v
    return out
