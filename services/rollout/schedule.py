"""Which prompt to generate next, so every prompt of every epoch is trained once.

A prompt key is (dataset_index, epoch). Keys move through three states:
issued (pending: generating, scoring, buffered or sent), done (trained, or
known to the trainer), or back in the re-issue queue (dropped as stale, failed
generation or scoring). Re-issues go first; then the epoch cursor walks the
per-epoch order. The trainer's resume point marks keys done and re-issues the
ones it lost (issued before, not pending here, not trained there). Pure logic.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

Key = tuple[int, int]  # (dataset_index, epoch)


class PromptScheduler:
    """Epoch cursor plus re-issue queue over prompt keys."""

    def __init__(self, order: Callable[[int], list[int]], num_epochs: int | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.order = order
        self.num_epochs = num_epochs
        self.clock = clock
        self.epoch = 0
        self.pos = 0
        self.pending: set[Key] = set()
        self.done: set[Key] = set()
        self.completed_epochs = 0
        self._reissue: deque[tuple[float, Key]] = deque()
        self.issued = 0
        self.reissued = 0

    # Issue
    def next(self) -> Key | None:
        """The next key to generate, or None when nothing is ready now."""
        key = self._next_reissue()
        if key is None:
            key = self._next_fresh()
        if key is not None:
            self.pending.add(key)
            self.issued += 1
        return key

    def _next_reissue(self) -> Key | None:
        now = self.clock()
        for _ in range(len(self._reissue)):
            ready_at, key = self._reissue[0]
            if ready_at > now:
                self._reissue.rotate(-1)
                continue
            self._reissue.popleft()
            if key in self.done or key in self.pending:
                continue
            self.reissued += 1
            return key
        return None

    def _next_fresh(self) -> Key | None:
        while self.num_epochs is None or self.epoch < self.num_epochs:
            order = self.order(self.epoch)
            while self.pos < len(order):
                key = (order[self.pos], self.epoch)
                self.pos += 1
                if key not in self.done and key not in self.pending:
                    return key
            self.epoch += 1
            self.pos = 0
        return None

    # Outcomes
    def trained(self, key: Key) -> None:
        """The trainer has this key (trained or buffered for training)."""
        self.pending.discard(key)
        self.done.add(key)

    def failed(self, key: Key, delay_s: float = 0.0) -> None:
        """Generation, scoring or staleness lost this key: issue it again."""
        self.pending.discard(key)
        if key not in self.done:
            self._reissue.append((self.clock() + delay_s, key))

    def resume(self, completed_epochs: int, trained: Iterable[Key]) -> int:
        """Adopt the trainer's resume point; re-issue keys it lost. Returns how many."""
        trained = set(trained)
        self.completed_epochs = completed_epochs
        if self.epoch < completed_epochs:
            self.epoch, self.pos = completed_epochs, 0
        lost = [k for k in self._passed() if k[1] >= completed_epochs and k not in trained
                and k not in self.pending and k in self.done]
        self.done = {k for k in self.done if k[1] < completed_epochs} | trained
        for k in lost:
            self._reissue.append((self.clock(), k))
        return len(lost)

    def _passed(self) -> Iterable[Key]:
        for e in range(self.completed_epochs, self.epoch + 1):
            order = self.order(e) if (self.num_epochs is None or e < self.num_epochs) else []
            upto = self.pos if e == self.epoch else len(order)
            for i in order[:upto]:
                yield (i, e)

    # State
    def exhausted(self) -> bool:
        """Every epoch issued and nothing left to re-issue or wait for. A re-issue of a key
        that got done meanwhile (a lost key whose held group reached the new trainer) does not
        count: `next` would skip it, and nothing may call `next` again once the work is done."""
        fresh_left = self.num_epochs is None or self.epoch < self.num_epochs
        reissue_left = any(k not in self.done for _, k in self._reissue)
        return not fresh_left and not reissue_left and not self.pending
