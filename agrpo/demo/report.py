"""What the demo shows beyond a job's line per step (agrpo/launcher/progress.py): a PNG of reward,
length and KL, a closing summary."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from agrpo.launcher.progress import number as _num


def window_means(rows: list[dict], key: str = "reward", n: int = 10) -> tuple[float, float]:
    """Mean of `key` over the first n and the last n steps."""
    values = [_num(r, key) for r in rows]
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values[:n]), statistics.fmean(values[-n:])


def plot(rows: list[dict], out: Path) -> Path:
    """Reward (mean and its spread within groups), completion length and the trainer/vLLM
    k3 KL against step, one PNG (GRPO's loss sits near 0 and says little)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [int(r["step"]) for r in rows]
    reward = [_num(r, "reward") for r in rows]
    spread = [_num(r, "reward_std") for r in rows]
    fig, (top, mid, bottom) = plt.subplots(3, 1, figsize=(7, 8), sharex=True)
    top.plot(steps, reward, marker=".", label="reward (mean)")
    top.fill_between(steps, [m - d for m, d in zip(reward, spread)], [m + d for m, d in zip(reward, spread)],
                     alpha=0.2, label="+- std within groups")
    top.set_ylabel("reward")
    top.legend(loc="lower right")
    mid.plot(steps, [_num(r, "completions/mean_length") for r in rows], color="tab:green", marker=".")
    mid.set_ylabel("completion tokens")
    bottom.plot(steps, [_num(r, "kl") for r in rows], color="tab:red", marker=".")
    bottom.set_ylabel("k3 KL to vLLM")
    bottom.set_xlabel("optimizer step")
    for ax in (top, mid, bottom):
        ax.grid(alpha=0.3)
    fig.suptitle("agrpo demo")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _finite(rows: list[dict], key: str) -> list[float]:
    return [v for v in (_num(r, key) for r in rows) if not math.isnan(v)]


def sync_ms(rows: list[dict]) -> dict:
    """Weight-sync time per step in ms (perf/weight_sync_s): n, first, median, min, max, and
    the median of each phase (perf/weight_sync/<phase>_s). {} when no step carried one."""
    totals = [v * 1000 for v in _finite(rows, "perf/weight_sync_s")]
    if not totals:
        return {}
    phases = sorted({k for r in rows for k in r if k.startswith("perf/weight_sync/") and k.endswith("_s")})
    return {"n": len(totals), "first": round(totals[0], 2), "median": round(statistics.median(totals), 2),
            "min": round(min(totals), 2), "max": round(max(totals), 2),
            "phases_median": {k[len("perf/weight_sync/"):-2]: round(statistics.median(v) * 1000, 2)
                              for k in phases if (v := _finite(rows, k))}}


def _stale_dropped(rows: list[dict], status: dict) -> int:
    """Samples the trainer dropped as stale: its GetStatus count when known, else the metrics'."""
    from_rows = max(_finite(rows, "sample/dropped_stale_total") or [sum(_finite(rows, "sample/dropped_stale"))])
    return int(max(from_rows, status.get("trainer_dropped", {}).get("stale", 0)))


STALE_AT_ROLLOUT = ("stale_generated", "stale_scored", "stale_buffered")
"""Rollout's drop reasons for generated groups it threw away as stale (stale_inflight were
aborted unfinished; stale_trainer are the trainer's own drops, counted there)."""


def stale_share(status: dict, group_size: int) -> tuple[int, float]:
    """(generated samples dropped as stale, that / samples generated), from the last statuses."""
    drops = status.get("rollout_drops", {})
    stale = status.get("trainer_dropped", {}).get("stale", 0) + group_size * sum(drops.get(k, 0)
                                                                              for k in STALE_AT_ROLLOUT)
    generated = status.get("samples_generated", 0)
    return stale, (stale / generated if generated else float("nan"))


def summary(rows: list[dict], wall_s: float, max_staleness: int, status: dict | None = None,
            group_size: int = 8) -> dict:
    """The numbers the demo ends with (also written as summary.json). `status` holds what
    the trainer's and rollout's GetStatus said last (see processes.status_numbers)."""
    status = status or {}
    first, last = window_means(rows)
    worst = max(_finite(rows, "sample/staleness_max"), default=float("nan"))
    versions = _finite(rows, "policy_version")
    rollout_drops = status.get("rollout_drops", {})
    return {"steps": len(rows), "wall_s": round(wall_s, 1), "reward_first10": first,
            "reward_last10": last, "reward_gain": last - first,
            "max_trained_staleness": worst, "max_staleness": max_staleness,
            "samples_trained": int(sum(_finite(rows, "sample/trained"))),
            "policy_version_first": int(versions[0]) if versions else None,
            "policy_version_last": int(max(versions)) if versions else None,
            "samples_dropped_stale": _stale_dropped(rows, status),
            "trainer_dropped": status.get("trainer_dropped", {}),
            "rollout_dropped_stale": sum(n for k, n in rollout_drops.items() if k.startswith("stale")),
            "rollout_drops": rollout_drops,
            "weight_sync_ms": sync_ms(rows),
            "dropped_stale_share": stale_share(status, group_size)[1],
            **{k: v for k, v in status.items() if k not in ("trainer_dropped", "rollout_drops")}}


def closing_lines(result: dict) -> list[str]:
    """What the demo prints at the end (the e2e test reads the first line)."""
    reward = (f"[demo] {result['steps']} steps in {result['wall_s']:.0f} s | reward first 10 steps "
              f"{result['reward_first10']:.3f} -> last 10 steps {result['reward_last10']:.3f} "
              f"({result['reward_gain']:+.3f})")
    versions = (f"[demo] policy versions {result['policy_version_first']} -> {result['policy_version_last']} | "
                f"samples trained {result['samples_trained']} | dropped as stale: trainer "
                f"{result['samples_dropped_stale']}, rollout {result['rollout_dropped_stale']} | "
                f"max staleness of a trained sample {result['max_trained_staleness']} "
                f"(limit {result['max_staleness']}) | stale / generated "
                f"{100 * result.get('dropped_stale_share', float('nan')):.1f}%")
    lines = [reward, versions]
    sync = result.get("weight_sync_ms") or {}
    if sync:
        phases = " ".join(f"{k} {v:.1f}" for k, v in sync["phases_median"].items())
        lines.append(f"[demo] weight sync ms ({result.get('weight_transport', '?')}): median {sync['median']:.1f} "
                     f"min {sync['min']:.1f} max {sync['max']:.1f} over {sync['n']} syncs | phases: {phases}")
    return lines
