"""Policy versions: the one definition of staleness, of a sample's version and of a weight label.

A version names one set of weights, forever: a resumed trainer publishes above every
version it ever published (`Lineage`). vLLM labels its weights with the decimal version
("default" before the first sync = version 0); a sample's version is the oldest version
that produced one of its trained tokens; a sample is stale when the trainer's version is
more than `max_staleness` positions ahead of it on the lineage, or when one of its tokens
came from weights off the lineage. Trainer and rollout both use these rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar, overload

_Fallback = TypeVar("_Fallback", bound=int | None)


def oldest_version(versions: Iterable[int | None], fallback: _Fallback) -> int | _Fallback:
    """The smallest known version (None entries are unknown), else `fallback`."""
    known = [v for v in versions if v is not None]
    return min(known) if known else fallback


def sample_versions(policy_version: int, span_versions: Iterable[int]) -> set[int]:
    """Every version a sample names: the one it states and each span's (all must be on the lineage)."""
    return {policy_version, *span_versions}


def sample_version(policy_version: int, span_versions: Iterable[int]) -> int:
    """A sample's version, the one staleness is judged by: the oldest it names. The producer
    may state an older one than its spans' (its group's oldest), never a newer one."""
    return min(sample_versions(policy_version, span_versions))


ADAPTER_PREFIX = "agrpo-v"
"""A LoRA version's adapter name in vLLM is this + the version (vllm_plugin/agrpo_vllm_plugin/adapters.py)."""


def adapter_name(version: int) -> str:
    """The vLLM adapter name that serves policy `version` under adapter-only sync."""
    return f"{ADAPTER_PREFIX}{version}"


def adapter_version(name: str) -> int:
    """The policy version an adapter name serves (adapter_name's inverse)."""
    if not name.startswith(ADAPTER_PREFIX):
        raise ValueError(f"{name!r} is not an agrpo adapter name")
    return int(name[len(ADAPTER_PREFIX):])


@overload
def label_to_version(label: str | None, fallback: int) -> int: ...
@overload
def label_to_version(label: str | None, fallback: None = None) -> int | None: ...
def label_to_version(label: str | None, fallback: int | None = None) -> int | None:
    """A vLLM weight label as a policy version: "default" is 0, "7" is 7, anything else
    (no label, a foreign label) is `fallback`."""
    if label == "default":
        return 0
    try:
        return int(label) if label else fallback
    except ValueError:
        return fallback


Segment = tuple[int, int | None, int]
"""(first_version, last_version or None while open, lineage index of first_version)."""


@dataclass(frozen=True)
class Lineage:
    """The versions the current policy descends from, and how far apart they are.

    A trainer that resumes from a checkpoint at version V publishes above every version it
    ever published (numbers are never reused), so the versions it published after V (weights
    the restart rolled back) are off the lineage, and the new numbers continue V's position:
    segments ((0, V, 0), (N, None, index(V) + k)). Staleness is the distance between
    positions; a version in no segment was published by weights that no longer exist.
    """

    segments: tuple[Segment, ...] = ((0, None, 0),)

    def index(self, version: int) -> int | None:
        """The version's position on this lineage, or None when it is off it."""
        for first, last, start in self.segments:
            if version >= first and (last is None or version <= last):
                return start + (version - first)
        return None

    def distance(self, newer: int, older: int) -> int | None:
        """Positions from `older` to `newer` (negative when older is ahead); None off lineage."""
        a, b = self.index(newer), self.index(older)
        return None if a is None or b is None else a - b

    def on_lineage(self, versions: Iterable[int]) -> bool:
        return all(self.index(v) is not None for v in versions)

    def stale(self, trainer_version: int, policy_version: int, max_staleness: int) -> bool:
        """Off the lineage, or further behind than max_staleness allows."""
        d = self.distance(trainer_version, policy_version)
        return d is None or d > max_staleness

    def resumed(self, at_version: int, new_version: int, ahead: int = 0) -> Lineage:
        """The lineage after resuming weights of `at_version` (+`ahead` unpublished steps) as
        `new_version`: versions published after at_version leave it."""
        at = self.index(at_version)
        if at is None:
            raise ValueError(f"version {at_version} is not on the lineage {self.segments}")
        kept = tuple((f, at_version if (last is None or last > at_version) else last, s)
                     for f, last, s in self.segments if f <= at_version)
        return Lineage(kept + ((new_version, None, at + ahead),))

    def to_list(self) -> list[list[int | None]]:
        return [list(s) for s in self.segments]

    @classmethod
    def from_list(cls, data) -> Lineage:
        return cls(tuple((int(f), None if last is None else int(last), int(s)) for f, last, s in data)) \
            if data else cls()


def lineage_to_proto(lineage: Lineage) -> list:
    """LineageSegment messages of a lineage."""
    from agrpo.v1 import common_pb2

    return [common_pb2.LineageSegment(first_version=f, first_index=s, **({} if last is None else {"last_version": last}))
            for f, last, s in lineage.segments]


def lineage_from_proto(segments) -> Lineage:
    """A lineage from LineageSegment messages (none: every version, as before lineages existed)."""
    if not segments:
        return Lineage()
    return Lineage(tuple((s.first_version, s.last_version if s.HasField("last_version") else None, s.first_index)
                         for s in segments))
