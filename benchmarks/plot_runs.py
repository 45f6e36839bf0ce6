"""plot_runs.py: reward against step and against seconds of training for several runs, one PNG.

  python benchmarks/plot_runs.py --out curves.png full=out/full-0 full=out/full-1 lora=out/lora-0

Each argument is LABEL=RUN where RUN is a folder holding metrics.jsonl (what `agrpo demo`,
`agrpo run` and the Python API write), or the file itself. Runs of one label share a colour
(seeds); a table of each label's first and last 10 steps' mean reward and seconds per step is
printed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def load(run: str) -> list[dict]:
    """The step rows of a run folder (or of its metrics.jsonl)."""
    path = Path(run)
    path = path / "metrics.jsonl" if path.is_dir() else path
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "step" in r and isinstance(r.get("reward"), (int, float)) and math.isfinite(r["reward"])]


def series(rows: list[dict]) -> tuple[list[int], list[float], list[float]]:
    """Steps, rewards and seconds since the first step was logged."""
    t0 = rows[0]["time"]
    return [r["step"] for r in rows], [r["reward"] for r in rows], [r["time"] - t0 for r in rows]


def table(runs: dict[str, list[list[dict]]]) -> list[str]:
    lines = ["| label | runs | reward, first 10 steps | reward, last 10 steps | s per step |", "|---|---|---|---|---|"]
    for label, group in runs.items():
        first = statistics.fmean(statistics.fmean(r["reward"] for r in rows[:10]) for rows in group)
        last = statistics.fmean(statistics.fmean(r["reward"] for r in rows[-10:]) for rows in group)
        per_step = statistics.fmean((rows[-1]["time"] - rows[0]["time"]) / max(1, len(rows) - 1) for rows in group)
        lines.append(f"| {label} | {len(group)} | {first:.3f} | {last:.3f} | {per_step:.3f} |")
    return lines


def plot(runs: dict[str, list[list[dict]]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for i, (label, group) in enumerate(runs.items()):
        colour = f"C{i}"
        for j, rows in enumerate(group):
            steps, reward, secs = series(rows)
            by_step.plot(steps, reward, color=colour, alpha=0.7, label=label if j == 0 else None)
            by_time.plot(secs, reward, color=colour, alpha=0.7, label=label if j == 0 else None)
    by_step.set_xlabel("optimizer step")
    by_time.set_xlabel("seconds since the first step")
    by_step.set_ylabel("reward (mean of the step's samples)")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="LABEL=RUN")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    p.add_argument("--title", default="reward")
    a = p.parse_args(argv)
    runs: dict[str, list[list[dict]]] = defaultdict(list)
    for arg in a.runs:
        label, sep, run = arg.partition("=")
        if not sep:
            p.error(f"{arg!r}: expected LABEL=RUN")
        try:
            rows = load(run)
        except (OSError, json.JSONDecodeError) as exc:
            p.error(f"{run}: {exc}")
        if not rows:
            p.error(f"{run}: no step with a reward")
        runs[label].append(rows)
    plot(runs, a.out, a.title)
    print("\n".join(table(runs)))
    print(f"plot: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
