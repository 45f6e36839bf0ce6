"""The trainer's counters and ledger (no torch: the server imports it before the model loads)."""

from __future__ import annotations

from dataclasses import dataclass

from .ledger import Ledger


@dataclass
class TrainState:
    """What the loop needs to continue: counters and the ledger."""

    step: int = 0
    version: int = 0
    version_step: int = -1  # optimizer step whose weights `version` carries
    ledger: Ledger | None = None

    def to_dict(self) -> dict:
        return {"step": self.step, "version": self.version, "version_step": self.version_step,
                "ledger": (self.ledger or Ledger()).to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> "TrainState":
        return cls(int(data["step"]), int(data["version"]), int(data.get("version_step", -1)),
                   Ledger.from_dict(data.get("ledger", {})))
