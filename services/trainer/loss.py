"""GRPO loss as TRL's AsyncGRPOTrainer computes it, as pure torch functions.

Per loss term t (a trained position of one sample):

    r_t = exp(logp_t - old_t)                          old_t: vLLM's behaviour logprob
    l_t = -min(r_t * A, clamp(r_t, 1 - eps, 1 + eps_high) * A)
    loss = sum_t l_t / max(step_terms / world, 1)     (every term of the step: GRPOTrainer's dapo)

With importance-sampling correction (GRPOConfig's `vllm_importance_sampling_*`, or
`tis_cap`), the surrogate is taken against the trainer's own logprob at step start
(the proximal policy: logp_t.detach(), since a batch gets one optimizer step) and each
term is weighted by w = rho = exp(logp.detach() - old) per token, or per sequence
(exp of the sum over the sample's terms):

    *_truncate: w = clamp(rho, clip_min, clip_max)
    *_mask:     w = rho where clip_min <= rho <= clip_max, else 0 (no gradient)

So a stale or mismatched sample is corrected by w instead of being clipped away by the
PPO range around vLLM's logprobs. Without correction (TRL AsyncGRPO's loss) w = 1 and
the clip range is around vLLM's behaviour logprobs.

Log-probabilities are computed only at labelled positions and in vocabulary chunks
(online logsumexp of logits / T, each chunk recomputed in backward), so memory stays
O(terms x chunk) instead of O(tokens x vocab).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeAlias

import torch
from torch.utils.checkpoint import checkpoint


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """Half precision up to float32; float32 and float64 as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _chunk_lse(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               temperature: float) -> torch.Tensor:
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    return torch.logsumexp(at_least_fp32(logits) / temperature, dim=-1)


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                     temperature: float = 1.0, chunk_size: int = 32768,
                     bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(hidden @ W.T / T)[labels] and the (detached) entropy, per row.

    hidden [N, H], weight [V, H], labels [N]. Gradients flow through the logprob only.
    """
    if hidden.shape[0] == 0:
        empty = at_least_fp32(hidden.new_zeros(0))
        return empty, empty
    temperature = temperature or 1.0
    target = (hidden * weight[labels]).sum(-1)
    if bias is not None:
        target = target + bias[labels]
    target = at_least_fp32(target) / temperature
    parts = []
    for start in range(0, weight.shape[0], chunk_size):
        w = weight[start:start + chunk_size]
        b = None if bias is None else bias[start:start + chunk_size]
        if torch.is_grad_enabled() and (hidden.requires_grad or w.requires_grad):
            parts.append(checkpoint(_chunk_lse, hidden, w, b, temperature, use_reentrant=False))
        else:
            parts.append(_chunk_lse(hidden, w, b, temperature))
    lse = torch.logsumexp(torch.stack(parts), dim=0)
    entropy = _entropy(hidden.detach(), weight.detach(), None if bias is None else bias.detach(),
                       lse.detach(), temperature, chunk_size)
    return target - lse, entropy


@torch.no_grad()
def _entropy(hidden, weight, bias, lse, temperature, chunk_size) -> torch.Tensor:
    """H = lse - sum_v p_v * l_v, accumulated chunk by chunk."""
    expected = torch.zeros_like(lse)
    for start in range(0, weight.shape[0], chunk_size):
        logits = hidden @ weight[start:start + chunk_size].T
        if bias is not None:
            logits = logits + bias[start:start + chunk_size]
        logits = at_least_fp32(logits) / temperature
        expected += (torch.exp(logits - lse[:, None]) * logits).sum(-1)
    return lse - expected


IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass
class LossConfig:
    """Clip ranges, temperature and the importance-sampling correction (None: off)."""

    epsilon: float = 0.2
    epsilon_high: float = 0.2
    temperature: float = 1.0
    tis_cap: float | None = None
    """Shorthand for is_mode="token_truncate" with is_max=tis_cap."""
    is_mode: str | None = None
    is_min: float | None = None
    is_max: float | None = None

    def __post_init__(self) -> None:
        if self.tis_cap is not None and self.is_mode is None:
            self.is_mode, self.is_max = "token_truncate", self.tis_cap
        if self.is_mode is not None and self.is_mode not in IS_MODES:
            raise ValueError(f"importance sampling mode must be one of {IS_MODES}, got {self.is_mode!r}")


def segment_sums(values: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
    """Each segment id's sum of `values` (one per term, or a row of them), indexed by id. One slot
    per term is room for every id without reading segment.max() from the device (torch.bincount
    reads it: a wait for the GPU)."""
    slots = torch.zeros((segment.numel(), *values.shape[1:]), dtype=values.dtype, device=values.device)
    return slots.index_add_(0, segment, values)


def importance_weights(log_rho: torch.Tensor, segment: torch.Tensor | None, cfg: LossConfig) -> torch.Tensor:
    """Per-term weights from log(pi_trainer / pi_vllm) (detached), per cfg.is_mode."""
    assert cfg.is_mode is not None, "importance_weights needs cfg.is_mode"  # both callers check it
    if cfg.is_mode.startswith("sequence"):
        seg = segment if segment is not None else torch.zeros_like(log_rho, dtype=torch.long)
        log_rho = segment_sums(log_rho, seg)[seg]
    rho = torch.exp(log_rho)
    lo = -math.inf if cfg.is_min is None else cfg.is_min
    hi = math.inf if cfg.is_max is None else cfg.is_max
    if cfg.is_mode.endswith("truncate"):
        return torch.clamp(rho, min=lo, max=hi)
    return torch.where((rho >= lo) & (rho <= hi), rho, torch.zeros_like(rho))


def per_term_loss(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, cfg: LossConfig,
                  segment: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate per term (IS-weighted when corrected), and the ratio to the behaviour policy."""
    ratio = torch.exp(logp - old)
    if cfg.is_mode is None:
        surrogate_ratio, weight = ratio, None
    else:
        surrogate_ratio = torch.exp(logp - logp.detach())
        weight = importance_weights((logp - old).detach(), segment, cfg)
    unclipped = surrogate_ratio * adv
    clipped = torch.clamp(surrogate_ratio, 1 - cfg.epsilon, 1 + cfg.epsilon_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    if weight is not None:
        loss = loss * weight
    return loss, ratio


def normalised_loss(per_term: torch.Tensor, step_terms: int, world_size: int = 1) -> torch.Tensor:
    """A row's share of the step's loss: its terms' sum over every term of the optimizer step (all
    micro-batches and ranks), as GRPOTrainer's dapo normalises the accumulated batch; not a mean of
    per-micro-batch means (TRL's async trainer, its issue #7206). `world_size` is the rows a
    micro-batch has: each row stands for one of them, and the caller divides by them again."""
    return per_term.sum() / max(step_terms / world_size, 1)


Stat: TypeAlias = tuple[torch.Tensor | float, torch.Tensor | float] | torch.Tensor | float
"""A diagnostic: (numerator, denominator) to sum over rows, or a plain extremum."""


def policy_stats(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, entropy: torch.Tensor,
                 segment: torch.Tensor, cfg: LossConfig,
                 staleness: torch.Tensor | None = None) -> dict[str, tuple[float, float] | float]:
    """policy_stat_tensors as Python numbers."""
    return materialize(policy_stat_tensors(logp, old, adv, entropy, segment, cfg, staleness))


@torch.no_grad()
def policy_stat_tensors(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, entropy: torch.Tensor,
                        segment: torch.Tensor, cfg: LossConfig, staleness: torch.Tensor | None = None,
                        stale_levels: list[int] | None = None) -> dict[str, Stat]:
    """TRL's diagnostics as (numerator, denominator) pairs, so they reduce over batches; 0-d
    tensors, read once per step (`materialize`): a read per statistic would stall the GPU
    between the forward and the backward.

    kl is the k3 estimator against the behaviour policy (the trainer/vLLM mismatch at
    step start, staleness included), also as mismatch/k3_kl_{mean,max} and per staleness
    (`stale_levels`: its distinct values when the caller knows them);
    clip_ratio/* are taken on the surrogate's ratio (1 at step start when IS-corrected);
    clip_ratio/low_min and high_max (plain values) are extrema over sequences.
    """
    n = float(logp.numel())
    log_ratio = logp - old
    ratio = torch.exp(log_ratio)
    k3 = (ratio - 1) - log_ratio
    surrogate = torch.ones_like(ratio) if cfg.is_mode else ratio
    low = ((surrogate < 1 - cfg.epsilon) & (adv < 0)).float()
    high = ((surrogate > 1 + cfg.epsilon_high) & (adv > 0)).float()
    stats: dict[str, Stat] = {
        "ratio": (ratio.sum(), n),
        "kl": (k3.sum(), n),
        "mismatch/k3_kl_mean": (k3.sum(), n),
        "entropy": (entropy.sum(), n),
        "clip_ratio/low_mean": (low.sum(), n),
        "clip_ratio/high_mean": (high.sum(), n),
        "clip_ratio/region_mean": ((low + high).clamp(max=1).sum(), n),
        "sampling/sampling_logp_difference/mean": (log_ratio.abs().sum(), n),
    }
    if not n:
        return stats
    stats["mismatch/k3_kl_max"] = k3.max()
    stats["sampling/sampling_logp_difference/max"] = log_ratio.abs().max()
    if cfg.is_mode:
        w = importance_weights(log_ratio, segment, cfg)
        stats["sampling/importance_sampling_ratio/mean"] = (w.sum(), n)
        stats["sampling/importance_sampling_ratio/min"] = w.min()
        stats["sampling/importance_sampling_ratio/max"] = w.max()
        stats["mismatch/masked_share"] = ((w == 0).float().sum(), n)
    if staleness is not None:
        for k in stale_levels if stale_levels is not None else torch.unique(staleness).tolist():
            at = staleness == k  # a product, not k3[at]: boolean indexing reads the mask's count
            stats[f"mismatch/k3_kl_mean/staleness_{int(k)}"] = ((k3 * at).sum(), at.sum())
    terms, low_sums, high_sums = segment_sums(torch.stack([torch.ones_like(low), low, high], 1), segment).unbind(1)
    absent = terms == 0  # segment ids with no term: left out of the extrema
    seg_low, seg_high = low_sums / terms.clamp(min=1), high_sums / terms.clamp(min=1)
    stats["clip_ratio/low_min"] = seg_low.masked_fill(absent, float("inf")).min()
    stats["clip_ratio/high_max"] = seg_high.masked_fill(absent, float("-inf")).max()
    return stats


def materialize(stats: dict) -> dict:
    """The same dict with every tensor read as a float, in one device-to-host copy."""
    leaves = [v for value in stats.values() for v in (value if isinstance(value, tuple) else (value,))
              if isinstance(v, torch.Tensor)]
    if not leaves:
        return dict(stats)
    read = iter(torch.stack([t.detach().reshape(()).double() for t in leaves]).tolist())

    def number(v):
        return next(read) if isinstance(v, torch.Tensor) else v

    return {k: tuple(number(v) for v in value) if isinstance(value, tuple) else number(value)
            for k, value in stats.items()}
