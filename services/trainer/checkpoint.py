"""Checkpoints: HF model (or the LoRA adapter) + tokenizer, optimizer, scheduler, RNG, step, version, ledger.

Layout: <output_dir>/checkpoint-<step>/ with the HF files, `optimizer.pt`
(optimizer, scheduler and RNG states) and `agrpo_state.json` (step, policy version,
the step whose weights that version carries, and the ledger). A checkpoint is written
to a temporary folder and renamed, so a crash never leaves a half checkpoint that
`latest` would pick. `save_total_limit` keeps the newest N. Finding and reading a
checkpoint's state needs no torch (the app restores it before the model loads).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from agrpo.services.common.logging import get_logger

from .state import TrainState

log = get_logger("trainer.checkpoint")
PREFIX = "checkpoint-"
STATE_FILE = "agrpo_state.json"
SHARDS = "shards"  # multi-rank: model and optimizer shards (torch.distributed.checkpoint)


def _rng_state() -> dict:
    import torch

    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(output_dir: str | Path, state: TrainState, model, tokenizer, optimizer, scheduler,
         total_limit: int | None = None, model_only: bool = False, write_shards=None) -> Path:
    """Write checkpoint-<step> atomically; prune beyond total_limit.

    write_shards (multi-rank): `write_shards(folder)` writes every rank's model and optimizer
    shards there (torch.distributed.checkpoint) and returns the whole weights (a LoRA model's
    adapter), which become the checkpoint's HF (or peft) files; optimizer.pt then holds only
    scheduler and RNG."""
    root = Path(output_dir)
    final = root / f"{PREFIX}{state.step}"
    tmp = root / f".{PREFIX}{state.step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    from . import lora

    whole = write_shards(tmp / SHARDS) if write_shards is not None else None
    if lora.has_adapter(model):  # the adapter alone, in peft's format
        lora.save_adapter(model, tmp, getattr(model, "name_or_path", None), whole)
    elif whole is not None:
        model.save_pretrained(tmp, state_dict={name: t.cpu() for name, t in whole})
    else:
        model.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if not model_only:
        import torch

        optim = {} if write_shards is not None else {"optimizer": optimizer.state_dict()}
        torch.save({**optim, "scheduler": scheduler.state_dict(), "rng": _rng_state()}, tmp / "optimizer.pt")
    (tmp / STATE_FILE).write_text(json.dumps(state.to_dict()))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    prune(root, total_limit)
    log.info("saved checkpoint %s", final)
    return final


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"{PREFIX}*") if (p / STATE_FILE).exists()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest(output_dir: str | Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def prune(output_dir: str | Path, total_limit: int | None) -> None:
    if not total_limit:
        return
    for old in list_checkpoints(output_dir)[:-total_limit]:
        shutil.rmtree(old, ignore_errors=True)


def read_state(path: str | Path) -> TrainState:
    return TrainState.from_dict(json.loads((Path(path) / STATE_FILE).read_text()))


def restore_optimizer(path: str | Path, optimizer, scheduler) -> bool:
    """Load optimizer, scheduler and RNG states; False for a model-only checkpoint."""
    file = Path(path) / "optimizer.pt"
    if not file.exists():
        return False
    import torch

    data = torch.load(file, weights_only=False)
    if "optimizer" in data:  # multi-rank checkpoints keep it in their shards
        optimizer.load_state_dict(data["optimizer"])
    scheduler.load_state_dict(data["scheduler"])
    _set_rng_state(data["rng"])
    return True
