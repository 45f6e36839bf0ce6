"""Sampling parameters and the one rule that turns logits into the distribution sampled from.

The logprobs returned are vLLM's `processed_logprobs`: of the distribution actually sampled
(temperature applied, then top-k, top-p and min-p filtering), which the trainer's importance
ratios need. Pure torch, no model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingParams:
    """vLLM's SamplingParams fields rollout sends (others are refused by the server)."""

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    n: int = 1
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    @classmethod
    def from_request(cls, body: dict) -> SamplingParams:
        """From a request's `sampling_params`; ValueError naming an unsupported field or value."""
        supported = {"max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop_token_ids",
                     "ignore_eos", "logprobs", "detokenize", "repetition_penalty", "seed"}
        unknown = sorted(set(body) - supported)
        if unknown:
            raise ValueError(f"sampling_params {unknown} are not supported by the trainer's generator")
        if float(body.get("repetition_penalty", 1.0)) != 1.0:
            raise ValueError("repetition_penalty is not supported by the trainer's generator")
        params = cls(max_tokens=int(body.get("max_tokens") or 16), min_tokens=int(body.get("min_tokens") or 0),
                     temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                     top_k=int(body.get("top_k", -1) or -1), min_p=float(body.get("min_p") or 0.0),
                     n=int(body.get("n", 1)), stop_token_ids=tuple(body.get("stop_token_ids") or ()),
                     ignore_eos=bool(body.get("ignore_eos", False)))
        if params.n < 1 or params.max_tokens < 1 or params.temperature < 0 or not 0 < params.top_p <= 1:
            raise ValueError(f"invalid sampling_params: {body}")
        return params


def processed_logprobs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Log-probabilities of the distributions sampled from, one row per sequence: logits / T,
    then tokens outside top-k, top-p or min-p set to -inf. Temperature 0 is greedy: the
    argmax gets logprob 0."""
    logits = logits.float()
    temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=logits.device)
    greedy = temps == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps).unsqueeze(1)
    if greedy.any():
        top = scaled.argmax(dim=-1, keepdim=True)
        only = torch.full_like(scaled, float("-inf")).scatter(1, top, 0.0)
        scaled = torch.where(greedy.unsqueeze(1), only, scaled)
    for i, p in enumerate(params):
        if p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0:
            scaled[i] = _filter(scaled[i], p)
    return torch.log_softmax(scaled, dim=-1)


def _filter(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    if 0 < p.top_k < row.numel():
        kth = torch.topk(row, p.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    if p.min_p > 0.0:
        row = row.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
        probs = torch.softmax(row, dim=-1)
    if p.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= p.top_p  # keep the token crossing top_p
        row = row.masked_fill(torch.zeros_like(outside).scatter(0, order, outside), float("-inf"))
    return row


def sample(logprobs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from its distribution, by inverting its CDF: one random number a row
    (torch.multinomial draws one per vocabulary entry, far slower at a large vocabulary:
    docs/vs-trl.md, "Where the time went")."""
    cdf = logprobs.exp().cumsum(dim=-1)
    u = torch.rand(cdf.shape[0], 1, generator=generator, dtype=cdf.dtype).to(cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=cdf.shape[1] - 1)
