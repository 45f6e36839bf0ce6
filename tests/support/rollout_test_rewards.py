"""Reward functions the rollout integration tests load into the real reward service."""


def distinct_tokens_reward(completion_ids, **kwargs):
    """Number of distinct tokens: deterministic from the ids, different across a group."""
    return [float(len(set(ids))) for ids in completion_ids]


def solution_seen_reward(completions, solution, **kwargs):
    """1.0 when the row's `solution` column arrived (proves dataset columns reach rewards)."""
    return [1.0 if s else None for s in solution]
