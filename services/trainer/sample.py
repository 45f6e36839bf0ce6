"""Domain types of the trainer: a training sample, an acknowledgement, a prompt key.

Plain dataclasses (no protobuf, no torch) so the buffer, ledger and planners are
pure and unit-testable; the servicer translates them to and from the proto.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

PromptKey = tuple[int, int]
"""(dataset_index, epoch): the unit of exactly-once accounting."""
MAX_ID_CHARS = 512
"""Longest sample_id or group_id: ids are keys of the ledger, echoed in acks, kept in the audit log."""
MAX_ABS_ADVANTAGE = 1e6
"""Largest |advantage| trained. GRPO advantages are centred rewards, far below this; near
float32's range the loss overflows and one step turns every weight into NaN."""


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
    """(policy_version, start, end) runs of generated tokens; audit trail only."""
    reward_errors: dict[str, str] = field(default_factory=dict)
    """Reward functions that failed on this sample -> their reason (from the reward service)."""
    group_size: int = 0
    """Rows of its group the producer sends (0: not given; the sample is then a group alone)."""
    sent_version: int | None = None
    """The producer's policy_version, when it differs from the oldest version of the spans
    (policy_version): never newer in a well-formed sample."""

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

    def validate(self, vocab_size: int | None = None) -> str | None:
        """Why the sample cannot be trained (the ack's reason names the field), or None when
        it is well formed. `vocab_size`: the model's, when known (token ids must index it)."""
        n = len(self.input_ids)
        if not self.sample_id or len(self.sample_id) > MAX_ID_CHARS:
            return f"sample_id must have 1 to {MAX_ID_CHARS} characters, not {len(self.sample_id)}"
        if len(self.group_id) > MAX_ID_CHARS:
            return f"group_id longer than {MAX_ID_CHARS} characters ({len(self.group_id)})"
        if n == 0:
            return "empty input_ids"
        if len(self.completion_mask) != n or len(self.behavior_logprobs) != n:
            return (f"length mismatch: input_ids {n}, completion_mask {len(self.completion_mask)}, "
                    f"behavior_logprobs {len(self.behavior_logprobs)}")
        if vocab_size is not None and not 0 <= min(self.input_ids) <= max(self.input_ids) < vocab_size:
            bad = next(t for t in self.input_ids if not 0 <= t < vocab_size)
            return f"token id {bad} outside the model's vocabulary [0, {vocab_size})"
        if any(m not in (0, 1) for m in self.completion_mask):
            return "completion_mask must be 0/1"
        if self.num_terms == 0:
            return "no trained token"
        if not 0 <= self.prompt_length <= n:
            return f"prompt_length {self.prompt_length} outside [0, {n}]"
        for p in range(1, n):  # the loss reads a logprob only where a token is trained (p >= 1)
            lp = self.behavior_logprobs[p]
            if self.completion_mask[p] and not (math.isfinite(lp) and lp <= 0.0):
                return f"behavior_logprobs[{p}] = {lp} at a trained token: must be finite and <= 0"
        if not (math.isfinite(self.advantage) and abs(self.advantage) <= MAX_ABS_ADVANTAGE):
            return f"advantage {self.advantage} is not finite or beyond +-{MAX_ABS_ADVANTAGE:g}"
        for version, start, end in self.version_spans:
            if not 0 <= start < end <= n:
                return f"version span [{start}, {end}) of version {version} is empty or outside the row of {n} tokens"
        if self.sent_version is not None and self.sent_version > self.policy_version:
            return (f"policy_version {self.sent_version} is newer than the oldest version of its spans "
                    f"({self.policy_version}): it must be the oldest")
        return None


@dataclass(frozen=True)
class Ack:
    """An acknowledgement for one sample, routed to its producer's stream."""

    sample_id: str
    outcome: Outcome
    prompt_key: PromptKey
    reason: str = ""
