"""The output folder as the record of one run: its id, the highest version ever published,
and what a fresh start or a resume does to what an earlier trainer left there.

- `run.json` holds the run id, the version high-water mark and whether the run finished. A
  version is reserved here before its weights are pushed, so no number can reach vLLM without
  being recorded: a resumed trainer publishes above it and never reuses a number for other
  weights.
- Which checkpoint to resume: an interrupted run continues, only a deliberate new run starts
  fresh (the table in docs/config.md, "Resuming"). `resume_from_checkpoint` true resumes the
  latest checkpoint, a path that one, and false (stated) starts a new run. Unset, a trainer
  continues the run it finds when that run did not finish, or carries its own run id: a
  supervisor that starts the same command again after a crash resumes it, with or without a
  `run_id`. A finished run, or another run id, starts a new run (as `agrpo run` does on every
  invocation, TRL's rule for a person running a script again); the previous run's files move
  to `previous/<run id>/` (nothing is deleted).
- On resume from step N, records of later steps in the audit log and the metrics file are
  moved to `<name>.rolled_back.jsonl`, so the main files hold each step once.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from . import checkpoint

RUN_FILE = "run.json"
PREVIOUS = "previous"


class ResumeError(ValueError):
    """A resume that cannot happen; the message names the config key."""


@dataclass
class RunRecord:
    """run.json: which run this folder holds and the highest version it ever published."""

    path: Path
    run_id: str
    max_version: int = 0
    max_staleness: int | None = None
    """The bound the run trains under (for `agrpo audit`)."""
    finished: bool = False
    """Training reached its end (max_steps or the epochs): a plain restart starts a new run."""

    def reserve(self, version: int) -> None:
        """Record `version` before its weights leave the trainer (atomic write)."""
        if version <= self.max_version:
            return
        self.max_version = version
        _write(self)

    def finish(self) -> None:
        """Record that training reached its end (after its last checkpoint)."""
        self.finished = True
        _write(self)

    def to_json(self) -> str:
        return json.dumps({"run_id": self.run_id, "max_version": self.max_version,
                           "max_staleness": self.max_staleness, "finished": self.finished})


def new_run_id() -> str:
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def read(output_dir: Path) -> RunRecord | None:
    path = output_dir / RUN_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return RunRecord(path, str(data.get("run_id", "")), int(data.get("max_version", 0)), data.get("max_staleness"),
                     bool(data.get("finished", False)))


@dataclass(frozen=True)
class Start:
    """How this trainer starts: from which checkpoint (None: scratch), as which run."""

    checkpoint: Path | None
    record: RunRecord
    restart: bool
    archived: Path | None = None


def plan(output_dir: Path, run_id: str | None, resume_from: bool | str | None,
         metrics_file: Path | None = None, max_staleness: int | None = None) -> Start:
    """Decide the start (see the module docstring) and set up run.json for it. A fresh run
    also moves an earlier metrics file (when it lives outside output_dir) to the archive."""
    output_dir.mkdir(parents=True, exist_ok=True)
    prev = read(output_dir)
    wanted = _resume_key(resume_from)
    if wanted is None and continues(prev, run_id):
        prev.max_staleness = max_staleness
        _write(prev)
        return Start(checkpoint.latest(output_dir), prev, restart=True)
    if wanted is True:
        ckpt = checkpoint.latest(output_dir)
        if ckpt is None:
            raise ResumeError(f"resume_from_checkpoint=true, but {output_dir} holds no checkpoint "
                              "(config key output_dir)")
        return Start(ckpt, _continued(output_dir, prev, run_id, max_staleness), restart=False)
    if isinstance(wanted, Path):
        if not (wanted / checkpoint.STATE_FILE).exists():
            raise ResumeError(f"resume_from_checkpoint={str(resume_from)!r} is not a checkpoint folder "
                              f"(no {checkpoint.STATE_FILE})")
        return Start(wanted, _continued(output_dir, prev, run_id, max_staleness), restart=False)
    archived = archive_previous(output_dir, prev, metrics_file)
    record = RunRecord(output_dir / RUN_FILE, run_id or new_run_id(), max_staleness=max_staleness)
    _write(record)
    return Start(None, record, restart=False, archived=archived)


def continues(prev: RunRecord | None, run_id: str | None) -> TypeGuard[RunRecord]:
    """With resume_from_checkpoint unset: does this trainer continue the run in output_dir?
    Its own run id always does (a restart inside the run); no run id continues a run that did
    not finish (a supervisor's restart after a crash); another run id never does."""
    if prev is None:
        return False
    if run_id:
        return prev.run_id == run_id
    return not prev.finished


def _resume_key(value: bool | str | None) -> bool | Path | None:
    """resume_from_checkpoint as True (the latest), a checkpoint path, False (stated: a new
    run) or None (unset)."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        return Path(value) if lowered else None
    return value


def _continued(output_dir: Path, prev: RunRecord | None, run_id: str | None,
               max_staleness: int | None) -> RunRecord:
    record = RunRecord(output_dir / RUN_FILE, run_id or (prev.run_id if prev else new_run_id()),
                       prev.max_version if prev else 0, max_staleness)
    _write(record)
    return record


def _write(record: RunRecord) -> None:
    tmp = record.path.with_suffix(".tmp")
    tmp.write_text(record.to_json())
    os.replace(tmp, record.path)


def archive_previous(output_dir: Path, prev: RunRecord | None, metrics_file: Path | None = None) -> Path | None:
    """Move an earlier run's checkpoints, logs and run.json to previous/<run id>/."""
    leftovers = [p for p in output_dir.iterdir() if p.name.startswith(checkpoint.PREFIX) or p.suffix == ".jsonl"]
    if metrics_file is not None and metrics_file.exists() and metrics_file.parent != output_dir:
        leftovers.append(metrics_file)
    if not leftovers:  # nothing trained there (a run.json alone is simply replaced)
        return None
    if (output_dir / RUN_FILE).exists():
        leftovers.append(output_dir / RUN_FILE)
    dest = output_dir / PREVIOUS / (prev.run_id if prev and prev.run_id else time.strftime("%Y%m%d-%H%M%S"))
    if dest.exists():
        dest = dest.with_name(f"{dest.name}-{uuid.uuid4().hex[:4]}")
    dest.mkdir(parents=True)
    for p in leftovers:
        shutil.move(str(p), dest / p.name)
    return dest


def rewind(path: Path, step: int) -> int:
    """Move the records of steps after `step` out of a JSONL file; return how many moved."""
    if not path.exists():
        return 0
    keep: list[str] = []
    moved: list[str] = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        (moved if isinstance(rec, dict) and int(rec.get("step", 0)) > step else keep).append(line)
    if moved:
        with path.with_suffix(".rolled_back.jsonl").open("a") as f:
            f.write("\n".join(moved) + "\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{line}\n" for line in keep))
    os.replace(tmp, path)
    return len(moved)
