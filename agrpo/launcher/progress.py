"""What a job shows while it runs: a progress bar and a line per step, from the trainer's metrics.

The trainer appends one JSON record per logged step to its metrics file; this follows the
file (a restarted trainer appends to it too) and prints `report.step_line` for each new
step, with a tqdm bar unless `disable_tqdm`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agrpo.demo import report


class StepFollower:
    """Prints new steps of a metrics JSONL as they appear."""

    def __init__(self, path: Path, total: int | None, disable_bar: bool = False) -> None:
        self.path = path
        self.seen = 0
        self.last_step = 0
        self.bar = None
        if not disable_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", dynamic_ncols=True, leave=True, file=sys.stdout)

    def poll(self) -> list[dict]:
        """Print and return the records written since the last poll."""
        rows = report.read_steps(self.path)
        new = rows[self.seen:]
        self.seen = len(rows)
        for row in new:
            self.write(report.step_line(row))
            if self.bar is not None:
                self.bar.update(max(0, int(row["step"]) - self.last_step))
            self.last_step = max(self.last_step, int(row["step"]))
        return new

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
