"""An append-only record of every trained sample: the exactly-once audit trail.

One JSON line per sample (step, trainer version, sample and group ids, the group's size,
prompt key, policy version and its per-token spans, staleness), flushed each step; a resume
moves the records past its checkpoint aside (run_record.rewind), so the file is the
effective history. `verify` (and `agrpo audit OUTPUT_DIR`) proves from it alone that every
prompt of every epoch was trained once, by one whole group, no sample twice, and nothing
past max_staleness; `agrees_with_checkpoint` that the latest checkpoint's ledger is the
history up to its step.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
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
            "group_id": s.group_id, "group_size": s.group_size, "prompt_key": list(s.prompt_key),
            "policy_version": s.policy_version, "staleness": d,
            "version_spans": [list(span) for span in s.version_spans],
            "completion_tokens": s.completion_length,
        }) for s, d in zip(samples, staleness, strict=True)]
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write("\n".join(lines) + "\n")


@dataclass
class Verdict:
    """What `verify` found: the counts, and every violation (empty: the run is exactly-once)."""

    samples: int = 0
    prompt_keys: int = 0
    steps: int = 0
    max_staleness_seen: int = 0
    problems: list[str] = field(default_factory=list)
    owed: dict[int, int] = field(default_factory=dict)  # epoch -> prompts in flight when a run stopped early

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        head = (f"{self.samples} samples, {self.prompt_keys} prompt keys, {self.steps} steps, "
                f"largest staleness {self.max_staleness_seen}")
        if self.owed:
            head += "; in flight at the stop, a resume trains them: " + ", ".join(
                f"{n} prompts of epoch {e}" for e, n in sorted(self.owed.items()))
        return f"exactly once: OK ({head})" if self.ok else f"FAILED ({head}): " + "; ".join(self.problems[:5])


def verify(path: Path, max_staleness: int | None = None, prompts_per_epoch: int | None = None,
           finished: bool = True) -> Verdict:
    """Check an audit log by itself: every prompt key trained by one group, no sample id
    twice, steps in order, no staleness past the bound, and (given the dataset size) no
    prompt missing from an epoch that should be whole (`epoch_gaps`; `finished`: the run
    ended by itself, not stopped early)."""
    v = Verdict()
    groups: dict[tuple, set[str]] = {}
    rows: dict[str, list[int]] = {}  # group id -> [rows trained, the group's size]
    ids: set[str] = set()
    last_step = 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        rec = json.loads(line)
        v.samples += 1
        key = tuple(rec["prompt_key"])
        groups.setdefault(key, set()).add(rec["group_id"])
        counted = rows.setdefault(rec["group_id"], [0, int(rec.get("group_size", 0))])
        counted[0] += 1
        if rec["sample_id"] in ids:
            v.problems.append(f"sample {rec['sample_id']} trained twice (line {n})")
        ids.add(rec["sample_id"])
        if rec["step"] < last_step:
            v.problems.append(f"line {n}: step {rec['step']} after step {last_step}")
        last_step = max(last_step, rec["step"])
        v.max_staleness_seen = max(v.max_staleness_seen, rec["staleness"])
        if rec["staleness"] < 0 or (max_staleness is not None and rec["staleness"] > max_staleness):
            v.problems.append(f"sample {rec['sample_id']} trained at staleness {rec['staleness']} "
                              f"(max_staleness {max_staleness})")
    v.prompt_keys, v.steps = len(groups), last_step
    for key, gs in sorted(groups.items()):
        if len(gs) > 1:
            v.problems.append(f"prompt key {list(key)} trained by {len(gs)} groups")
    for group_id, (trained, size) in rows.items():
        if size and trained != size:
            v.problems.append(f"group {group_id}: {trained} of its {size} rows trained")
    if prompts_per_epoch:
        lost, v.owed = epoch_gaps(Counter(k[1] for k in groups), prompts_per_epoch, finished)
        v.problems += [f"epoch {e}: {n} of {prompts_per_epoch} prompts never trained" for e, n in sorted(lost.items())]
    return v


def trained_per_epoch(path: Path) -> Counter[int]:
    """Distinct prompts trained so far, per epoch (the log of a live run; empty before its first step)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return Counter()
    keys = {tuple(json.loads(line)["prompt_key"]) for line in lines if line.strip()}
    return Counter(epoch for _, epoch in keys)


def epoch_gaps(trained: Counter[int], per_epoch: int, finished: bool) -> tuple[dict[int, int], dict[int, int]]:
    """Prompts missing per epoch, split into lost and owed (epoch -> count).

    A finished run trained every epoch before its last. A run stopped early may still owe the
    prompts in flight at the stop (its resume point counts their epochs unfinished, so a resume
    trains them), and epochs overlap: rollout moves on to the next epoch while a dropped
    prompt of this one is re-issued. Those can only belong to epochs after the last whole one,
    because rollout re-issues a dropped prompt before any new one: a prompt missing from an
    epoch that a whole epoch follows was lost."""
    last = max(trained, default=-1)
    whole = [e for e in trained if trained[e] >= per_epoch]
    must_be_whole = last if finished else max(whole, default=-1)
    lost: dict[int, int] = {}
    owed: dict[int, int] = {}
    for e in range(last):
        missing = per_epoch - trained.get(e, 0)
        if missing > 0:
            (lost if e < must_be_whole else owed)[e] = missing
    return lost, owed


def agrees_with_checkpoint(path: Path, checkpoint_dir: Path) -> list[str]:
    """Where the audit log and a checkpoint's ledger disagree (empty: they agree): the ledger
    must hold exactly the sample ids the log records up to the checkpoint's step, and every
    prompt key of an unfinished epoch the log trained by then."""
    from .checkpoint import read_state

    state = read_state(checkpoint_dir)
    logged_ids: set[str] = set()
    logged_keys: set[tuple[int, int]] = set()
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["step"] <= state.step:
            logged_ids.add(rec["sample_id"])
            logged_keys.add(tuple(rec["prompt_key"]))
    ledger = state.ledger
    problems = []
    if ledger.trained_ids != logged_ids:
        problems.append(f"{checkpoint_dir.name}: {len(ledger.trained_ids - logged_ids)} sample ids of its ledger "
                        f"are not in the audit log up to step {state.step}, "
                        f"{len(logged_ids - ledger.trained_ids)} logged ones not in the ledger")
    missing = ledger.trained_keys - logged_keys
    if missing:
        problems.append(f"{checkpoint_dir.name}: {len(missing)} prompt keys of its ledger never appear "
                        f"in the audit log (e.g. {sorted(missing)[0]})")
    return problems


def main(argv: list[str]) -> int:
    """`agrpo audit OUTPUT_DIR [--max-staleness N] [--prompts N]`: 0 when exactly once."""
    import argparse

    p = argparse.ArgumentParser(prog="agrpo audit", description="Prove a run trained every prompt once, "
                                "no sample twice and nothing past max_staleness, from its audit log.")
    p.add_argument("output_dir", type=Path)
    p.add_argument("--max-staleness", type=int, default=None, help="default: the run's (run.json)")
    p.add_argument("--prompts", type=int, default=None, help="dataset size: also check complete epochs")
    a = p.parse_args(argv)
    log = a.output_dir / "trained_samples.jsonl"
    if not log.exists():
        print(f"agrpo audit: {log} not found", file=sys.stderr)
        return 2
    from . import run_record
    from .checkpoint import latest

    record = run_record.read(a.output_dir)  # the run's bound, and whether it finished or was stopped
    bound = a.max_staleness if a.max_staleness is not None or record is None else record.max_staleness
    verdict = verify(log, bound, a.prompts, finished=record is None or record.finished)
    newest = latest(a.output_dir)
    if newest is not None:
        verdict.problems += agrees_with_checkpoint(log, newest)
    print(verdict.line() + (f"; agrees with {newest.name}" if newest is not None and verdict.ok else ""))
    return 0 if verdict.ok else 1
