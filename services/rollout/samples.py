"""Scored groups -> RolloutSamples: the one place a sample and its metrics are built.

A strategy turns its group into `Row`s (one per generation, or several for a forked
conversation); `ScoredGroup` carries what every sample of the group shares (rewards,
advantages, scoring times). Metric names are TRL's (reward, reward_std, rewards/<f>,
generation_tok_per_s, scoring_time_ms, wait_scoring_ms, buffer_qsize) plus whatever the
row adds (tools/*, rollout/*).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agrpo.services.common.identity import now_timestamp
from agrpo.services.common.versions import sample_version
from agrpo.v1 import common_pb2

from .advantage import group_advantages, group_stats


@dataclass
class ScoredGroup:
    """Rewards of a group's generations and what follows from them."""

    rewards: list[float]
    components: dict[str, list[float]]
    scoring_ms: float
    wait_ms: float
    errors: list[dict[str, str]] | None = None
    """Per generation: reward function -> reason it failed (None: no failure)."""
    advantages: list[float] = field(init=False)
    mean: float = field(init=False)
    std: float = field(init=False)

    def __post_init__(self) -> None:
        self.advantages = group_advantages(self.rewards)
        self.mean, self.std = group_stats(self.rewards)


@dataclass
class Row:
    """One training row of generation `generation` (fork `fork` of a conversation)."""

    generation: int
    input_ids: list[int]
    completion_mask: list[int]
    logprobs: list[float]
    prompt_length: int
    spans: list[tuple[int, int, int]]
    """(policy_version, start, end) runs of generated tokens, in row coordinates."""
    policy_version: int
    """What the strategy states (e.g. its group's oldest); the sample's is `sample_version` of it and the spans."""
    tok_per_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    fork: int = 0


def build_samples(group, prompt, rows: list[Row], scored: ScoredGroup, texts: list[str], *,
                  send_text: bool, producer_id: str, buffered: int) -> list[common_pb2.RolloutSample]:
    """One RolloutSample per row; text fields only when `send_text`."""
    key = common_pb2.PromptKey(dataset_index=group.key[0], epoch=group.key[1])
    out = []
    for row in rows:
        i = row.generation
        components = {name: values[i] for name, values in scored.components.items()}
        metrics = {"reward": scored.rewards[i], "reward_std": scored.std,
                   "generation_tok_per_s": row.tok_per_s, "scoring_time_ms": scored.scoring_ms,
                   "wait_scoring_ms": scored.wait_ms, "buffer_qsize": float(buffered), **row.metrics,
                   **{f"rewards/{name}": v for name, v in components.items()}}
        out.append(common_pb2.RolloutSample(
            sample_id=group.request_id(i) + (f"-f{row.fork}" if row.fork else ""), group_id=group.group_id,
            prompt_key=key, policy_version=sample_version(row.policy_version, (v for v, _, _ in row.spans)),
            version_spans=[common_pb2.VersionSpan(policy_version=v, start=s, end=e) for v, s, e in row.spans],
            input_ids=row.input_ids, completion_mask=row.completion_mask, behavior_logprobs=row.logprobs,
            prompt_length=row.prompt_length, advantage=scored.advantages[i], reward=scored.rewards[i],
            reward_components=components, metrics=metrics, generation_index=i,
            reward_errors=scored.errors[i] if scored.errors else {},
            prompt_text=prompt.prompt_text if send_text else "",
            completion_text=texts[i] if send_text else "", created_at=now_timestamp(),
            producer_id=producer_id, group_size=len(rows)))
    return out
