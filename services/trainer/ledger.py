"""What has been trained: sample ids (dedupe) and prompt keys (exactly-once per epoch).

Epochs count distinct prompts trained: an epoch is complete when all of its
`prompts_per_epoch` prompt keys are trained, so forks and re-issues of a prompt do
not inflate it. A prompt key counts as trained once any of its samples is trained
(as TRL counts a group). Exactly once: the first group that enters a batch for a
prompt key owns it; samples of any other group for that key (a re-issue that raced
with a partly trained group) are refused. The resume point lists trained keys of
unfinished epochs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import cast

from .sample import PromptKey, Sample


def _key(sample: Sample) -> PromptKey:
    """The sample's prompt key as a hashable tuple (a caller may have built it as a list)."""
    return cast(PromptKey, tuple(sample.prompt_key))


class Ledger:
    """Trained sample ids and prompt keys; serialisable for checkpoints."""

    def __init__(self, prompts_per_epoch: int = 0) -> None:
        self.prompts_per_epoch = prompts_per_epoch
        self.trained_ids: set[str] = set()
        self.trained_keys: set[PromptKey] = set()
        self.owners: dict[PromptKey, str] = {}  # prompt key -> the group that trains it
        self._per_epoch: Counter[int] = Counter()

    def is_trained(self, sample_id: str) -> bool:
        return sample_id in self.trained_ids

    def owned_by_other(self, sample: Sample) -> bool:
        """True when another group already owns (trained or batched) this prompt key."""
        owner = self.owners.get(_key(sample))
        return owner is not None and owner != sample.group_id

    def claim(self, sample: Sample) -> bool:
        """Make the sample's group the owner of its key if none is; False if another owns it.

        Called when a fresh sample enters a batch, so a group whose samples were all
        dropped as stale never owns its key and the prompt's re-issue can train."""
        if self.owned_by_other(sample):
            return False
        self.owners.setdefault(_key(sample), sample.group_id)
        return True

    def release(self, samples: Iterable[Sample]) -> None:
        """Drop the claims of samples removed untrained (evicted as stale) unless their key
        was trained meanwhile, so the prompt's re-issue can own it."""
        for s in samples:
            key = _key(s)
            if key not in self.trained_keys and self.owners.get(key) == s.group_id:
                del self.owners[key]

    def record(self, samples: Iterable[Sample]) -> list[PromptKey]:
        """Mark samples trained; return prompt keys trained for the first time."""
        new: list[PromptKey] = []
        for s in samples:
            self.trained_ids.add(s.sample_id)
            key = _key(s)
            self.owners.setdefault(key, s.group_id)
            if key not in self.trained_keys:
                self.trained_keys.add(key)
                self._per_epoch[key[1]] += 1
                new.append(key)
        return new

    @property
    def prompts_trained(self) -> int:
        return len(self.trained_keys)

    @property
    def completed_epochs(self) -> int:
        """Leading epochs with every prompt trained (0 while prompts_per_epoch is unknown)."""
        if self.prompts_per_epoch <= 0:
            return 0
        e = 0
        while self._per_epoch.get(e, 0) >= self.prompts_per_epoch:
            e += 1
        return e

    def target_prompts(self, num_train_epochs: float) -> int:
        """Distinct prompt keys to train for `num_train_epochs`; 0 when unknown."""
        if self.prompts_per_epoch <= 0:
            return 0
        return math.ceil(num_train_epochs * self.prompts_per_epoch)

    def reached(self, num_train_epochs: float) -> bool:
        target = self.target_prompts(num_train_epochs)
        return target > 0 and self.prompts_trained >= target

    def unfinished_keys(self) -> list[PromptKey]:
        """Trained keys of epochs not yet complete, sorted (the resume point's list)."""
        done = self.completed_epochs
        return sorted(k for k in self.trained_keys if k[1] >= done)

    def to_dict(self) -> dict:
        return {"prompts_per_epoch": self.prompts_per_epoch, "trained_ids": sorted(self.trained_ids),
                "trained_keys": sorted(list(k) for k in self.trained_keys),
                "owners": sorted([k[0], k[1], g] for k, g in self.owners.items() if k in self.trained_keys)}

    @classmethod
    def from_dict(cls, data: dict) -> Ledger:
        ledger = cls(int(data.get("prompts_per_epoch", 0)))
        ledger.trained_ids = set(data.get("trained_ids", []))
        for idx, epoch in data.get("trained_keys", []):
            ledger.trained_keys.add((int(idx), int(epoch)))
            ledger._per_epoch[int(epoch)] += 1
        for idx, epoch, group in data.get("owners", []):
            ledger.owners[(int(idx), int(epoch))] = group
        return ledger
