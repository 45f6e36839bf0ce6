"""Turn a multi-turn conversation into training rows, token for token (pure).

Every turn re-renders the whole conversation to `prompt_ids` and reconciles it
with the row held so far (`held`): `matched` = common prefix, `drift` =
len(held) - matched.

- CLEAN (drift 0): the new prompt tail is appended as context (mask 0), then
  the turn's output (mask 1, behaviour logprobs, policy versions).
- REALIGN (matched >= start of the last output and drift < fork_threshold):
  a re-tokenisation wobble inside the last answer; held[matched:] is replaced
  by the new tail as context (those drift tokens lose their training signal).
- FORK (anything else): the current row is closed and a new row starts with
  the whole new prompt as context, so tokens trained in earlier rows keep
  their signal instead of being masked.

Each generated token is trained in at most one row (exactly one unless a
realign masked it); rows without a trained token are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agrpo.services.common.versions import oldest_version

CLEAN, REALIGN, FORK = "clean", "realign", "fork"


@dataclass
class Row:
    """One training row: context and trained tokens interleaved."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int | None] = field(default_factory=list)
    """Policy version per token (None for context)."""
    last_output_start: int = 0

    def add(self, ids, mask: int, logprobs=None, versions=None) -> None:
        n = len(ids)
        self.ids.extend(ids)
        self.mask.extend([mask] * n)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * n)
        self.versions.extend(versions if versions is not None else [None] * n)

    def truncate(self, n: int) -> None:
        del self.ids[n:], self.mask[n:], self.logprobs[n:], self.versions[n:]

    @property
    def trained(self) -> int:
        return sum(self.mask)

    def spans(self) -> list[tuple[int, int, int]]:
        """(version, start, end) runs over the trained tokens, in row coordinates."""
        out: list[tuple[int, int, int]] = []
        for i, (m, v) in enumerate(zip(self.mask, self.versions)):
            if not m or v is None:
                continue
            if out and out[-1][0] == v and out[-1][2] == i:
                out[-1] = (v, out[-1][1], i + 1)
            else:
                out.append((v, i, i + 1))
        return out

    def oldest_version(self) -> int | None:
        return oldest_version((v for m, v in zip(self.mask, self.versions) if m), None)


@dataclass
class Tally:
    """How the turns were reconciled (logged as rollout/fork_frac, realign_frac, drift)."""

    clean: int = 0
    realign: int = 0
    fork: int = 0
    drift_tokens: list[int] = field(default_factory=list)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Reconciler:
    """Accumulates turns into rows; call `add_turn` per turn, then `rows()`."""

    def __init__(self, fork_threshold_tokens: int) -> None:
        self.fork_threshold = fork_threshold_tokens
        self._rows: list[Row] = [Row()]
        self.tally = Tally()

    @property
    def current(self) -> Row:
        return self._rows[-1]

    def classify(self, prompt_ids: list[int]) -> tuple[str, int, int]:
        """(decision, matched, drift) for the next turn's rendered prompt."""
        held = self.current.ids
        matched = common_prefix(held, prompt_ids)
        drift = len(held) - matched
        if drift == 0:
            return CLEAN, matched, drift
        if matched >= self.current.last_output_start and drift < self.fork_threshold:
            return REALIGN, matched, drift
        return FORK, matched, drift

    def add_turn(self, prompt_ids: list[int], output_ids: list[int], logprobs: list[float],
                 versions: Sequence[int | None] | None = None, output_mask: list[int] | None = None) -> str:
        """Reconcile one turn; returns the decision taken."""
        if len(logprobs) != len(output_ids):
            raise ValueError(f"{len(output_ids)} output tokens but {len(logprobs)} logprobs")
        if output_mask is not None and len(output_mask) != len(output_ids):
            raise ValueError("output_mask length differs from the output")
        versions = list(versions) if versions is not None else [None] * len(output_ids)
        decision, matched, drift = self.classify(prompt_ids)
        if decision == FORK:
            self._rows.append(Row())
            matched = 0
        elif decision == REALIGN:
            self.current.truncate(matched)
        row = self.current
        row.add(prompt_ids[matched:], 0)
        row.last_output_start = len(row.ids)
        if output_mask is None:
            row.add(output_ids, 1, list(logprobs), versions)
        else:
            for t, m, lp, v in zip(output_ids, output_mask, logprobs, versions):
                row.add([t], int(m), [lp], [v if m else None])  # a masked token keeps its logprob (TRL)
        setattr(self.tally, decision, getattr(self.tally, decision) + 1)
        if decision != CLEAN:
            self.tally.drift_tokens.append(drift)
        return decision

    def rows(self) -> list[Row]:
        """The rows with at least one trained token."""
        return [r for r in self._rows if r.trained]


def reconcile(turns, fork_threshold_tokens: int) -> tuple[list[Row], Tally]:
    """All turns at once: each turn is (prompt_ids, output_ids, logprobs[, versions])."""
    rec = Reconciler(fork_threshold_tokens)
    for t in turns:
        rec.add_turn(*t)
    return rec.rows(), rec.tally
