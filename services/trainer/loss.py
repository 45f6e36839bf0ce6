"""GRPO loss as TRL's AsyncGRPOTrainer computes it, as pure torch functions.

Per loss term t (a trained position of one sample):

    r_t = exp(logp_t - old_t)                          old_t: vLLM's behaviour logprob
    l_t = -min(r_t * A, clamp(r_t, 1 - eps, 1 + eps_high) * A)
    loss = sum_t l_t / max(global_terms / world, 1) / grad_accum

With the optional truncated importance-sampling correction (`tis_cap`), the surrogate is
taken against the trainer's own (detached) logprob and weighted by
w_t = min(exp(logp_t.detach() - old_t), tis_cap), which corrects the trainer/vLLM
mismatch instead of clipping it away. Off by default, as in TRL.

Log-probabilities are computed only at labelled positions and in vocabulary chunks
(online logsumexp of logits / T, each chunk recomputed in backward), so memory stays
O(terms x chunk) instead of O(tokens x vocab).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint


def _chunk_lse(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               temperature: float) -> torch.Tensor:
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    return torch.logsumexp(logits.float() / temperature, dim=-1)


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                     temperature: float = 1.0, chunk_size: int = 32768,
                     bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(hidden @ W.T / T)[labels] and the (detached) entropy, per row.

    hidden [N, H], weight [V, H], labels [N]. Gradients flow through the logprob only.
    """
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    temperature = temperature or 1.0
    target = (hidden * weight[labels]).sum(-1)
    if bias is not None:
        target = target + bias[labels]
    target = target.float() / temperature
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
        logits = logits.float() / temperature
        expected += (torch.exp(logits - lse[:, None]) * logits).sum(-1)
    return lse - expected


@dataclass
class LossConfig:
    """Clip ranges, temperature and the optional TIS cap."""

    epsilon: float = 0.2
    epsilon_high: float = 0.2
    temperature: float = 1.0
    tis_cap: float | None = None


def per_term_loss(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor,
                  cfg: LossConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate per term, and the ratio against the behaviour policy."""
    ratio = torch.exp(logp - old)
    if cfg.tis_cap is None:
        surrogate_ratio, weight = ratio, None
    else:
        surrogate_ratio = torch.exp(logp - logp.detach())
        weight = torch.clamp(ratio.detach(), max=cfg.tis_cap)
    unclipped = surrogate_ratio * adv
    clipped = torch.clamp(surrogate_ratio, 1 - cfg.epsilon, 1 + cfg.epsilon_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    if weight is not None:
        loss = loss * weight
    return loss, ratio


def normalised_loss(per_term: torch.Tensor, global_terms: int, world_size: int = 1,
                    grad_accum: int = 1) -> torch.Tensor:
    """TRL's token normalisation: per micro-batch across ranks, then averaged over GA."""
    return per_term.sum() / max(global_terms / world_size, 1) / grad_accum


@torch.no_grad()
def policy_stats(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, entropy: torch.Tensor,
                 segment: torch.Tensor, cfg: LossConfig) -> dict[str, tuple[float, float]]:
    """TRL's diagnostics as (numerator, denominator) pairs, so they reduce over batches.

    kl is the k3 estimator against the behaviour policy; clip_ratio/low_min and
    high_max (plain values) are extrema over sequences of their clip fraction.
    """
    n = float(logp.numel())
    log_ratio = logp - old
    ratio = torch.exp(log_ratio)
    low = ((ratio < 1 - cfg.epsilon) & (adv < 0)).float()
    high = ((ratio > 1 + cfg.epsilon_high) & (adv > 0)).float()
    stats = {
        "ratio": (ratio.sum().item(), n),
        "kl": ((ratio - 1) - log_ratio).sum().item() if n else 0.0,
        "entropy": (entropy.sum().item(), n),
        "clip_ratio/low_mean": (low.sum().item(), n),
        "clip_ratio/high_mean": (high.sum().item(), n),
        "clip_ratio/region_mean": ((low + high).clamp(max=1).sum().item(), n),
    }
    stats["kl"] = (stats["kl"], n)
    if n:
        counts = torch.bincount(segment).clamp(min=1).float()
        seg_low = torch.bincount(segment, weights=low) / counts
        seg_high = torch.bincount(segment, weights=high) / counts
        present = torch.bincount(segment) > 0
        stats["clip_ratio/low_min"] = seg_low[present].min().item()
        stats["clip_ratio/high_max"] = seg_high[present].max().item()
    return stats
