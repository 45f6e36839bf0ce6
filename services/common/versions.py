"""Policy versions: the one definition of staleness, of a sample's version and of a weight label.

A version names one set of weights. vLLM labels its weights with the decimal version
("default" before the first sync = version 0); a sample's version is the oldest version
that produced one of its trained tokens; a sample is stale when the trainer's version
is more than `max_staleness` ahead of it. Trainer and rollout both use these rules.
"""

from __future__ import annotations

from collections.abc import Iterable


def is_stale(trainer_version: int, policy_version: int, max_staleness: int) -> bool:
    """True when `policy_version` lags `trainer_version` by more than `max_staleness`."""
    return trainer_version - policy_version > max_staleness


def oldest_version(versions: Iterable[int | None], fallback: int) -> int:
    """The smallest known version (None entries are unknown), else `fallback`."""
    known = [v for v in versions if v is not None]
    return min(known) if known else fallback


def label_to_version(label: str | None, fallback: int | None = None) -> int | None:
    """A vLLM weight label as a policy version: "default" is 0, "7" is 7, anything else
    (no label, a foreign label) is `fallback`."""
    if label == "default":
        return 0
    try:
        return int(label) if label else fallback
    except ValueError:
        return fallback
