"""What the demo shows: a line per step, a PNG of reward and loss, a closing summary."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path


def read_steps(path: Path) -> list[dict]:
    """Step records of the trainer's metrics JSONL (lines with a "step")."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def _num(row: dict, key: str) -> float:
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) else float("nan")


def step_line(row: dict) -> str:
    """`step 12 | v 12 | reward 0.41 | staleness 0.8 | 21.3 samples/s | loss -0.003`."""
    wall = _num(row, "perf/step_s") + _num(row, "perf/wait_s")
    samples_per_s = _num(row, "sample/trained") / wall if wall > 0 else float("nan")
    return (f"step {int(row['step']):>4} | v {int(_num(row, 'policy_version')):>3} | "
            f"reward {_num(row, 'reward'):.3f} | staleness {_num(row, 'sample/staleness_mean'):.2f} | "
            f"{samples_per_s:5.1f} samples/s | loss {_num(row, 'loss'):+.4f}")


def window_means(rows: list[dict], key: str = "reward", n: int = 10) -> tuple[float, float]:
    """Mean of `key` over the first n and the last n steps."""
    values = [_num(r, key) for r in rows]
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values[:n]), statistics.fmean(values[-n:])


def plot(rows: list[dict], out: Path) -> Path:
    """Reward and loss against step, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [int(r["step"]) for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot(steps, [_num(r, "reward") for r in rows], marker=".", label="reward (mean)")
    top.set_ylabel("reward")
    top.grid(alpha=0.3)
    top.legend(loc="lower right")
    bottom.plot(steps, [_num(r, "loss") for r in rows], color="tab:red", marker=".", label="loss")
    bottom.set_xlabel("optimizer step")
    bottom.set_ylabel("loss")
    bottom.grid(alpha=0.3)
    fig.suptitle("agrpo demo")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def summary(rows: list[dict], wall_s: float, max_staleness: int) -> dict:
    """The numbers the demo ends with (also written as summary.json)."""
    first, last = window_means(rows)
    worst = max((_num(r, "sample/staleness_max") for r in rows
                 if not math.isnan(_num(r, "sample/staleness_max"))), default=float("nan"))
    return {"steps": len(rows), "wall_s": round(wall_s, 1), "reward_first10": first,
            "reward_last10": last, "reward_gain": last - first,
            "max_trained_staleness": worst, "max_staleness": max_staleness,
            "samples_trained": int(sum(_num(r, "sample/trained") for r in rows))}
