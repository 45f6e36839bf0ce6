"""An append-only record of every trained sample: the exactly-once audit trail.

One JSON line per sample (step, trainer version, sample and group ids, prompt key,
policy version and its per-token spans, staleness), flushed each step. Operators (and
the end-to-end test) can prove from it that every prompt of every epoch was trained
once and that no trained token was older than max_staleness allows.
"""

from __future__ import annotations

import json
from pathlib import Path

from .sample import Sample


class TrainedSampleLog:
    """Appends one line per trained sample to `path` (created on first write)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, step: int, version: int, samples: list[Sample], staleness: list[int]) -> None:
        """Record the samples trained by optimizer step `step` at trainer version `version`;
        `staleness` is each one's distance on the lineage (equal to the version difference
        unless a resume renumbered versions)."""
        lines = [json.dumps({
            "step": step, "trainer_version": version, "sample_id": s.sample_id,
            "group_id": s.group_id, "prompt_key": list(s.prompt_key),
            "policy_version": s.policy_version, "staleness": d,
            "version_spans": [list(span) for span in s.version_spans],
            "completion_tokens": s.completion_length,
        }) for s, d in zip(samples, staleness, strict=True)]
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write("\n".join(lines) + "\n")
