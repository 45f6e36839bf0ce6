"""The per-step metric dict, with TRL 1.16's names (sample/*, batch/*, perf/*).

Pure bookkeeping over what one step consumed; `perf/mfu` needs the accelerator's
peak (trainer.peak_tflops) and is omitted without it.
"""

from __future__ import annotations

import math
import statistics


def _mean(values) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(values) if values else float("nan")


def _num_params(model) -> int:
    cached = getattr(model, "_agrpo_num_params", None)
    if cached is None:
        cached = sum(p.numel() for p in model.parameters())
        model._agrpo_num_params = cached
    return cached


def step_metrics(loop, step_in, stats: dict) -> dict:
    """Everything logged for one step."""
    samples = [s for mb in step_in.batches for s in mb.samples]
    forward = sum(mb.num_forward_tokens for mb in step_in.batches)
    raw = sum(len(s) for s in samples)
    compute_s = stats.get("perf/step_s", 0.0)
    wall = compute_s + step_in.wait_s
    out = dict(stats)
    out.update({
        "policy_version": loop.state.version,
        "epoch": (loop.ledger.prompts_trained / loop.ledger.prompts_per_epoch
                  if loop.ledger.prompts_per_epoch else float("nan")),
        "completions/mean_length": _mean([s.completion_length for s in samples]),
        "completions/max_length": max((s.completion_length for s in samples), default=0),
        "reward": _mean([s.reward for s in samples]),
        "reward_std": _mean([s.metrics.get("reward_std") for s in samples]),
        "advantage/mean": _mean([s.advantage for s in samples]),
        "sample/trained": len(samples),
        "sample/staleness_mean": _mean([step_in.trained_version - s.policy_version for s in samples]),
        "sample/staleness_max": max((step_in.trained_version - s.policy_version for s in samples), default=0),
        "sample/dropped_stale": len(step_in.stale),
        "sample/dropped_stale_total": loop.dropped.get("stale", 0),
        "sample/prompts_trained_total": loop.ledger.prompts_trained,
        "batch/num_micro_batches": len(step_in.batches),
        "batch/num_samples": len(samples),
        "batch/forward_tokens": forward,
        "batch/loss_terms": sum(mb.num_terms for mb in step_in.batches),
        "batch/mean_seq_len": forward / max(len(samples), 1),
        "batch/prefix_share_saving": 1 - forward / raw if raw else 0.0,
        "batch/dropped_oversize_total": loop.dropped.get("oversize", 0),
        "perf/wait_s": step_in.wait_s,
        "perf/idle_fraction": step_in.wait_s / wall if wall > 0 else 0.0,
        "perf/tokens_per_s": forward / compute_s if compute_s > 0 else 0.0,
    })
    _rewards(out, samples)
    _sample_metrics(out, samples)
    _perf(out, loop, forward, compute_s)
    return out


def _sample_metrics(out: dict, samples) -> None:
    """Means of what rollout measured per sample, under its names (tools/call_frequency,
    tools/failure_frequency, generation_tok_per_s, scoring_time_ms, ...)."""
    names = {k for s in samples for k in s.metrics}
    for name in sorted(names - set(out)):
        out[name] = _mean([s.metrics.get(name) for s in samples])


def _rewards(out: dict, samples) -> None:
    names = {k for s in samples for k in s.reward_components}
    for name in sorted(names):
        out[f"rewards/{name}/mean"] = _mean([s.reward_components.get(name) for s in samples])


def _perf(out: dict, loop, forward: int, compute_s: float) -> None:
    flops = 6 * _num_params(loop.engine.model) * forward  # forward + backward, dense estimate
    out["perf/tflops"] = flops / compute_s / 1e12 if compute_s > 0 else 0.0
    peak = loop.cfg.trainer.peak_tflops
    if peak:
        out["perf/mfu"] = out["perf/tflops"] / peak
    if loop.last_sync:
        out["perf/weight_sync_s"] = loop.last_sync.get("total", 0.0)
        for phase, secs in loop.last_sync.items():
            if phase != "total":
                out[f"perf/weight_sync/{phase}_s"] = secs
        loop.last_sync = {}
