"""What a job shows while it runs: a progress bar and a line per step, from the trainer's metrics.

The trainer appends one JSON record per logged step to its metrics file; this follows the
file (a restarted trainer appends to it too) and prints `step_line` for each new step, with a
tqdm bar unless `disable_tqdm`.
"""

from __future__ import annotations

import json
import sys
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


def number(row: dict, key: str) -> float:
    """A metric of a step record as a float (NaN when absent or not a number)."""
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) else float("nan")


def step_line(row: dict) -> str:
    """`step 12 | v 12 | reward 0.41 | staleness 0.8 | 21.3 samples/s | loss -0.003`."""
    wall = number(row, "perf/step_s") + number(row, "perf/wait_s")
    samples_per_s = number(row, "sample/trained") / wall if wall > 0 else float("nan")
    return (f"step {int(row['step']):>4} | v {int(number(row, 'policy_version')):>3} | "
            f"reward {number(row, 'reward'):.3f} | staleness {number(row, 'sample/staleness_mean'):.2f} | "
            f"{samples_per_s:5.1f} samples/s | loss {number(row, 'loss'):+.4f}")


class StepFollower:
    """Prints new steps of a metrics JSONL as they appear. With `since` (a time.time()), records
    written before it (a resumed run's earlier steps, kept in the file) move the bar to where
    that run left off instead of being printed again."""

    def __init__(self, path: Path, total: int | None, disable_bar: bool = False, since: float | None = None) -> None:
        self.path = path
        self.since = since
        self.seen = 0
        self.last_step = 0
        self.bar = None
        if not disable_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", dynamic_ncols=True, leave=True, file=sys.stdout)

    def poll(self) -> list[dict]:
        """Print and return the records written since the last poll."""
        rows = read_steps(self.path)
        new = rows[self.seen:]
        self.seen = len(rows)
        for row in new:
            if not self._earlier(row):
                self.write(step_line(row))
            if self.bar is not None:
                self.bar.update(max(0, int(row["step"]) - self.last_step))
            self.last_step = max(self.last_step, int(row["step"]))
        return new

    def _earlier(self, row: dict) -> bool:
        return self.since is not None and number(row, "time") < self.since

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
