"""Domain types of the trainer: a training sample, an acknowledgement, a prompt key.

Plain dataclasses (no protobuf, no torch) so the buffer, ledger and planners are
pure and unit-testable; the servicer translates them to and from the proto.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

PromptKey = tuple[int, int]
"""(dataset_index, epoch): the unit of exactly-once accounting."""


class Outcome(enum.IntEnum):
    """What happened to a sample (values mirror SampleOutcome in the proto)."""

    ACCEPTED = 1
    TRAINED = 2
    DUPLICATE = 3
    DROPPED_STALE = 4
    REJECTED = 5


@dataclass
class Sample:
    """One training row as the trainer needs it."""

    sample_id: str
    group_id: str
    prompt_key: PromptKey
    policy_version: int
    input_ids: list[int]
    completion_mask: list[int]
    behavior_logprobs: list[float]
    advantage: float
    reward: float = float("nan")
    producer_id: str = ""
    prompt_length: int = 0
    reward_components: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    prompt_text: str = ""
    completion_text: str = ""
    version_spans: list[tuple[int, int, int]] = field(default_factory=list)
    reward_errors: dict[str, str] = field(default_factory=dict)
    """Reward functions that failed on this sample -> their reason (from the reward service)."""
    """(policy_version, start, end) runs of generated tokens; audit trail only."""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_terms(self) -> int:
        """Loss terms of this sample: trained positions p >= 1 (position 0 has no context)."""
        return sum(self.completion_mask[1:])

    @property
    def completion_length(self) -> int:
        """Tokens the policy sampled (completion_mask ones)."""
        return sum(self.completion_mask)

    def validate(self) -> str | None:
        """Why the sample cannot be trained, or None when it is well formed."""
        n = len(self.input_ids)
        if not self.sample_id:
            return "empty sample_id"
        if n == 0:
            return "empty input_ids"
        if len(self.completion_mask) != n or len(self.behavior_logprobs) != n:
            return (f"length mismatch: input_ids {n}, completion_mask {len(self.completion_mask)}, "
                    f"behavior_logprobs {len(self.behavior_logprobs)}")
        if any(m not in (0, 1) for m in self.completion_mask):
            return "completion_mask must be 0/1"
        if self.num_terms == 0:
            return "no trained token"
        return None


@dataclass(frozen=True)
class Ack:
    """An acknowledgement for one sample, routed to its producer's stream."""

    sample_id: str
    outcome: Outcome
    prompt_key: PromptKey
    reason: str = ""
