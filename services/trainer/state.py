"""The trainer's counters, ledger and lineage (no torch: the app restores it before the model loads)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agrpo.services.common.versions import Lineage

from .ledger import Ledger


@dataclass
class TrainState:
    """What the loop needs to continue: counters, the ledger and the version lineage."""

    step: int = 0
    version: int = 0
    version_step: int = -1  # optimizer step whose weights `version` carries
    ledger: Ledger = field(default_factory=Ledger)
    lineage: Lineage = field(default_factory=Lineage)

    def to_dict(self) -> dict:
        return {"step": self.step, "version": self.version, "version_step": self.version_step,
                "ledger": self.ledger.to_dict(), "lineage": self.lineage.to_list()}

    @classmethod
    def from_dict(cls, data: dict) -> TrainState:
        return cls(int(data["step"]), int(data["version"]), int(data.get("version_step", -1)),
                   Ledger.from_dict(data.get("ledger", {})), Lineage.from_list(data.get("lineage")))

    def staleness(self, policy_version: int) -> int | None:
        """Positions the trainer's version is ahead of `policy_version` (None: off the lineage)."""
        return self.lineage.distance(self.version, policy_version)
