"""The per-step metric dict, with TRL 1.16's names (sample/*, batch/*, perf/*).

Pure bookkeeping over what one step consumed and the counters passed in; `perf/mfu`
needs the accelerator's peak (trainer.peak_tflops) and is omitted without it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def _mean(values) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return float("nan")
    try:
        return statistics.fmean(values)
    except (ValueError, OverflowError):  # fsum refuses inf - inf and overflows past 1.8e308
        return sum(values) / len(values)


@dataclass(frozen=True)
class FlopModel:
    """What a step's FLOPs depend on: the matmul parameters (the input embedding is a lookup,
    not a matmul, unless tied to the head), the attention width and depth, how rows run."""

    matmul_params: int
    hidden_size: int
    num_layers: int
    tree: bool = True
    """Prefix-tree rows (a shared prompt computed once) or one chain per sample."""
    recompute: float = 0.0
    """Gradient checkpointing: the share of layers whose forward runs again in the backward."""

    @classmethod
    def of(cls, model, tree: bool, recompute: float) -> FlopModel:
        total = sum(p.numel() for p in model.parameters())
        embed = model.get_input_embeddings().weight
        tied = any(p is embed for p in model.get_output_embeddings().parameters())
        cfg = model.config
        return cls(total if tied else total - embed.numel(), cfg.hidden_size, cfg.num_hidden_layers, tree,
                   float(recompute))

    def forward_flops(self, tokens: int, pairs: int) -> float:
        """One forward: 2 FLOPs per matmul parameter per token, 4 x hidden per attended (q, kv)
        pair per layer (scores and values)."""
        return 2.0 * self.matmul_params * tokens + 4.0 * self.hidden_size * self.num_layers * pairs


def step_metrics(step_in, stats: dict, *, version: int, ledger, drops, flops: FlopModel,
                 peak_tflops: float | None, last_sync: dict[str, float], token_budget: int | None = None,
                 sync_bytes: int = 0) -> dict:
    """Everything logged for one step: `stats` from the engine, the step's samples, the
    ledger's and drop counters' totals, and the last weight sync's phase times and size."""
    samples = [s for mb in step_in.batches for s in mb.samples]
    forward = sum(mb.num_forward_tokens for mb in step_in.batches)
    raw = sum(len(s) for s in samples)
    compute_s = stats.get("perf/step_s", 0.0)
    wall = compute_s + step_in.wait_s
    out = dict(stats)
    out.update({
        "policy_version": version,
        "epoch": ledger.prompts_trained / ledger.prompts_per_epoch if ledger.prompts_per_epoch else float("nan"),
        "completions/mean_length": _mean([s.completion_length for s in samples]),
        "completions/max_length": max((s.completion_length for s in samples), default=0),
        "reward": _mean([s.reward for s in samples]),
        "reward_std": _mean([s.metrics.get("reward_std") for s in samples]),
        "advantage/mean": _mean([s.advantage for s in samples]),
        "sample/trained": len(samples),
        "sample/staleness_mean": _mean(step_in.staleness),
        "sample/staleness_max": max(step_in.staleness, default=0),
        "sample/dropped_stale": len(step_in.stale),
        "sample/dropped_stale_total": drops["stale"],
        "sample/prompts_trained_total": ledger.prompts_trained,
        "batch/num_micro_batches": len(step_in.batches),
        "batch/num_samples": len(samples),
        "batch/forward_tokens": forward,
        "batch/loss_terms": sum(mb.num_terms for mb in step_in.batches),
        "batch/mean_seq_len": forward / max(len(samples), 1),
        "batch/prefix_share_saving": 1 - forward / raw if raw else 0.0,
        "batch/dropped_oversize_total": drops["oversize"],
        "perf/wait_s": step_in.wait_s,
        "perf/idle_fraction": step_in.wait_s / wall if wall > 0 else 0.0,
    })
    _rewards(out, samples)
    _sample_metrics(out, samples)
    _collator(out, step_in.batches, token_budget)
    out.update(throughput(flops, step_in.batches, samples, compute_s, peak_tflops))
    _sync(out, last_sync, sync_bytes)
    return out


def _collator(out: dict, batches, token_budget: int | None) -> None:
    """TRL's collator metrics, per micro-batch then averaged over the step's: what is forwarded
    and trained per sample, how full and balanced the rows are (a row's load is its tree
    attention cost, the sum of depth + 1 over its tokens). No padding: rows run one by one."""
    per = []
    for mb in batches:
        samples = [s for row in mb.rows for s in row.samples]
        if not samples:
            continue
        forwarded = [len(s) for s in samples]
        trained = [s.completion_length for s in samples]
        row_tokens = [len(row.input_ids) for row in mb.rows]
        loads = [sum(d + 1 for d in row.position_ids) for row in mb.rows]
        m = {"sample/forwarded_tokens_mean": statistics.fmean(forwarded),
             "sample/forwarded_tokens_max": float(max(forwarded)),
             "sample/trained_tokens_mean": statistics.fmean(trained),
             "batch/masked_token_frac": (sum(forwarded) - sum(trained)) / sum(forwarded),
             "batch/samples_per_row": len(samples) / len(mb.rows),
             "batch/row_tokens_mean": statistics.fmean(row_tokens), "batch/row_tokens_max": float(max(row_tokens)),
             "batch/row_imbalance": max(loads) / statistics.fmean(loads) if sum(loads) else 1.0,
             "batch/packing_ratio": sum(forwarded) / sum(row_tokens), "batch/pad_frac": 0.0}
        if token_budget:
            m["batch/row_fill_frac"] = sum(row_tokens) / (token_budget * len(mb.rows))
        per.append(m)
    for key in per[0] if per else ():
        out[key] = statistics.fmean(m[key] for m in per)


def _sample_metrics(out: dict, samples) -> None:
    """Means of what rollout measured per sample, under its names (tools/call_frequency,
    tools/failure_frequency, generation_tok_per_s, scoring_time_ms, ...). tools/* average
    over the samples that carry them: TRL sets them only for groups that called a tool.
    Per-function rewards are _rewards' (rewards/<f>/mean and /std), not repeated here."""
    names = {k for s in samples for k in s.metrics if not k.startswith("rewards/")}
    for name in sorted(names - set(out)):
        out[name] = _mean([s.metrics.get(name) for s in samples])


def _std(values) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values or any(math.isinf(v) for v in values):
        return float("nan")  # as torch.std; statistics.pstdev raises on infinities
    try:
        return statistics.pstdev(values)
    except OverflowError:
        return math.inf


def _rewards(out: dict, samples) -> None:
    """TRL's reward metrics: rewards/<f>/mean and /std, frac_reward_zero_std (share of the
    step's groups whose rewards do not vary, which teach nothing)."""
    names = {k for s in samples for k in s.reward_components}
    for name in sorted(names):
        values = [s.reward_components.get(name) for s in samples]
        out[f"rewards/{name}/mean"] = _mean(values)
        out[f"rewards/{name}/std"] = _std(values)
    groups: dict[str, list[float]] = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s.reward)
    flat = [g for g in groups.values() if len(g) > 1]
    if flat:
        out["frac_reward_zero_std"] = sum(1 for g in flat if _std(g) == 0) / len(flat)


def throughput(flops: FlopModel, batches, samples, compute_s: float, peak: float | None) -> dict[str, float]:
    """Throughput as peers log it. Tokens and (q, kv) pairs actually computed: a tree row's unique
    tokens and load, else every sample's chain. perf/mfu: model FLOPs (forward and backward,
    attention included, checkpoint recompute not) per second over the peak; perf/hfu: every FLOP
    executed (the recompute too). perf/unshared_mfu counts every sample's prompt as if it were
    computed: the MFU a trainer without prefix sharing would need for the same step time."""
    if compute_s <= 0:
        return {}
    lengths = [len(s) for s in samples]
    chains = sum(n * (n + 1) // 2 for n in lengths)
    if flops.tree:
        tokens, pairs = sum(mb.num_forward_tokens for mb in batches), sum(sum(mb.load) for mb in batches)
    else:
        tokens, pairs = sum(lengths), chains
    model = 3 * flops.forward_flops(tokens, pairs)
    executed = model + flops.recompute * flops.forward_flops(tokens, pairs)
    out = {"perf/tokens_per_s": tokens / compute_s}
    out["perf/sample_tokens_per_s"] = sum(lengths) / compute_s
    out["perf/tflops"] = model / compute_s / 1e12
    if peak:
        out["perf/mfu"] = model / compute_s / (peak * 1e12)
        out["perf/hfu"] = executed / compute_s / (peak * 1e12)
        out["perf/unshared_mfu"] = 3 * flops.forward_flops(sum(lengths), chains) / compute_s / (peak * 1e12)
    return out


def _sync(out: dict, last_sync: dict[str, float], sync_bytes: int) -> None:
    if last_sync:
        out["perf/weight_sync_s"] = last_sync.get("total", 0.0)
        if sync_bytes:  # what the transport carried (0 when nothing travels: weight_transport local)
            out["perf/weight_sync_mb"] = sync_bytes / 2**20
        for phase, secs in last_sync.items():
            if phase != "total":
                out[f"perf/weight_sync/{phase}_s"] = secs
