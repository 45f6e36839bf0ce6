"""Prefix-tree packing and the micro-batch planners (TRL 1.16.0 semantics, pure Python).

The samples of a GRPO group share their prompt, so a rank's row is a trie: a shared
token is forwarded once. A trie node is keyed by ``(token, next_token)`` under its
parent, so samples share a node only when they also agree on the next token; every
node then carries exactly one next-token label, and the trie forks one token before
two samples diverge. A row's *load* is the number of (query, key) pairs tree
attention computes: a new node at depth d adds d + 1 (a lone chain of L tokens costs
L(L+1)/2).

Loss terms are an explicit list: for each sample i and each position p >= 1 with
``completion_mask[p] == 1`` there is one term scoring ``ids[p]`` from the packed
position of the node at p - 1, with the sample's own behaviour logprob and advantage.
A shared position may therefore carry several terms.

Planners: `TokenBudgetBatcher` (budget counts unique tokens and caps loss terms;
a sample goes first to a row holding its group; rows are never empty; oversize
samples are dropped) and `FixedCountBatcher` (``token_budget <= 0``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from .sample import Sample

_NodeKey = tuple[int, int | None]


def sample_keys(sample: Sample) -> list[_NodeKey]:
    """Trie keys of a sample: each token with its successor (None for the last)."""
    ids = sample.input_ids
    return [(ids[i], ids[i + 1] if i + 1 < len(ids) else None) for i in range(len(ids))]


@dataclass
class PackedRow:
    """One rank's row, collated: unique tokens plus the loss-term list.

    Over the N unique tokens (in trie pre-order): input_ids, position_ids (trie depth),
    parent (packed index of the parent node, -1 for roots), subtree_end (the last packed
    index inside the node's subtree, so kv is an ancestor-or-self of q iff
    kv <= q <= subtree_end[kv]: the tree-attention mask), shift_labels (-100 where unscored).
    Over the M terms: token_index, labels, old_logprobs, advantages, segment_id (the
    sample's slot in the row) and sample_position (p - 1, for the unpacked path).
    """

    input_ids: list[int]
    position_ids: list[int]
    parent: list[int]
    subtree_end: list[int]
    shift_labels: list[int]
    token_index: list[int]
    labels: list[int]
    old_logprobs: list[float]
    advantages: list[float]
    segment_id: list[int]
    sample_position: list[int]
    samples: list[Sample]

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_terms(self) -> int:
        return len(self.token_index)


class TreeRow:
    """A trie of samples with its token count, trained-term count and attention load."""

    def __init__(self) -> None:
        self.tokens: list[int] = []           # node -> token
        self.next_tokens: list[int | None] = []
        self.depth: list[int] = []
        self.parent: list[int] = []
        self.children: list[dict[_NodeKey, int]] = []
        self.roots: dict[_NodeKey, int] = {}
        self.samples: list[Sample] = []
        self.paths: list[list[int]] = []      # sample slot -> node per position
        self.groups: set[str] = set()
        self.load = 0
        self.trained = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def _child(self, node: int, key: _NodeKey) -> int | None:
        table = self.roots if node < 0 else self.children[node]
        return table.get(key)

    def shared_prefix(self, sample: Sample) -> int:
        """Leading positions of the sample already present in the trie."""
        node, n = -1, 0
        for key in sample_keys(sample):
            child = self._child(node, key)
            if child is None:
                break
            node, n = child, n + 1
        return n

    def fits(self, sample: Sample, budget: int) -> bool:
        """Unique tokens and loss terms both stay within the budget."""
        new_tokens = len(sample) - self.shared_prefix(sample)
        # TRL counts every mask bit (sum(completion_mask)), position 0 included.
        return len(self) + new_tokens <= budget and self.trained + sample.completion_length <= budget

    def add(self, sample: Sample) -> None:
        """Walk or create the sample's nodes; new nodes add their attention cost."""
        node, path = -1, []
        for d, key in enumerate(sample_keys(sample)):
            child = self._child(node, key)
            if child is None:
                child = len(self.tokens)
                self.tokens.append(key[0])
                self.next_tokens.append(key[1])
                self.depth.append(d)
                self.parent.append(node)
                self.children.append({})
                (self.roots if node < 0 else self.children[node])[key] = child
                self.load += d + 1
            node = child
            path.append(node)
        self.samples.append(sample)
        self.paths.append(path)
        self.groups.add(sample.group_id)
        self.trained += sample.completion_length

    def pack(self) -> PackedRow:
        """Collate: DFS pre-order of the trie, subtree intervals, and the term list."""
        order = self._preorder()
        pos = {node: i for i, node in enumerate(order)}
        parent = [pos[self.parent[n]] if self.parent[n] >= 0 else -1 for n in order]
        labels_at = [-100] * len(order)
        term: dict[str, list] = {k: [] for k in ("token_index", "labels", "old", "adv", "seg", "spos")}
        for slot, (sample, path) in enumerate(zip(self.samples, self.paths)):
            ids, mask, old = sample.input_ids, sample.completion_mask, sample.behavior_logprobs
            for p in range(1, len(ids)):
                if not mask[p]:
                    continue
                at = pos[path[p - 1]]
                labels_at[at] = ids[p]
                term["token_index"].append(at)
                term["labels"].append(ids[p])
                term["old"].append(float(old[p]))
                term["adv"].append(float(sample.advantage))
                term["seg"].append(slot)
                term["spos"].append(p - 1)
        return PackedRow(
            input_ids=[self.tokens[n] for n in order], position_ids=[self.depth[n] for n in order],
            parent=parent, subtree_end=subtree_end(parent), shift_labels=labels_at,
            token_index=term["token_index"],
            labels=term["labels"], old_logprobs=term["old"], advantages=term["adv"],
            segment_id=term["seg"], sample_position=term["spos"], samples=list(self.samples))

    def _preorder(self) -> list[int]:
        out: list[int] = []
        stack = list(reversed(self.roots.values()))  # dicts keep insertion order
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(self.children[node].values()))
        return out


def subtree_end(parent: list[int]) -> list[int]:
    """Pre-order layout: the last index inside each node's subtree (its own index for a leaf).

    A child comes after its parent in pre-order, so one backward pass settles every node.
    """
    end = list(range(len(parent)))
    for i in range(len(parent) - 1, -1, -1):
        p = parent[i]
        if p >= 0 and end[i] > end[p]:
            end[p] = end[i]
    return end


@dataclass
class MicroBatch:
    """P rows (one per rank) and the counts the loss normaliser needs."""

    rows: list[PackedRow]
    num_terms: int = 0
    num_forward_tokens: int = 0
    num_samples: int = 0
    load: list[int] = field(default_factory=list)

    @property
    def samples(self) -> list[Sample]:
        return [s for row in self.rows for s in row.samples]


def collate(rows: list[TreeRow]) -> MicroBatch:
    """Pack every row; global counts are sums over rows (ranks)."""
    packed = [r.pack() for r in rows]
    return MicroBatch(rows=packed, num_terms=sum(p.num_terms for p in packed),
                      num_forward_tokens=sum(p.num_tokens for p in packed),
                      num_samples=sum(len(p.samples) for p in packed), load=[r.load for r in rows])


DropFn = Callable[[Sample, str], None]


class TokenBudgetBatcher:
    """Streams samples into micro-batches of P rows, each within `budget`.

    Placement: (1) the least-loaded fitting row already holding the sample's group;
    (2) else, if rows hold the group and no row is empty, close the micro-batch;
    (3) else the least-loaded fitting row; (4) if none fits, close and start fresh.
    Ties go to the lowest row index. Oversize samples are dropped through `on_drop`.
    `max_samples` optionally closes a micro-batch after that many samples.
    """

    def __init__(self, num_rows: int, budget: int, on_drop: DropFn | None = None,
                 max_samples: int | None = None) -> None:
        if num_rows < 1 or budget < 1:
            raise ValueError("num_rows and budget must be >= 1")
        self.num_rows, self.budget, self.max_samples = num_rows, budget, max_samples
        self.on_drop = on_drop or (lambda s, r: None)
        self.rows = [TreeRow() for _ in range(num_rows)]

    @property
    def num_samples(self) -> int:
        return sum(len(r.samples) for r in self.rows)

    @property
    def open_samples(self) -> list[Sample]:
        return [s for r in self.rows for s in r.samples]

    def add(self, sample: Sample) -> list[MicroBatch]:
        """Place one sample; return the micro-batches this closed (zero or one)."""
        out = self._put(sample)
        return out + self._close_if_at_max()

    def add_group(self, group: list[Sample]) -> list[MicroBatch]:
        """Place a whole group: into the open micro-batch when it fits there, else into the
        next one (the open one closes first). Only a group larger than a micro-batch spans
        several; the loop then keeps its tail in the same step."""
        out = []
        if self.num_samples and self._all_rows_used() and not self._room_for(group):
            out.append(self._close())
        for sample in group:
            out += self._put(sample)
        return out + self._close_if_at_max()

    def _put(self, sample: Sample) -> list[MicroBatch]:
        if len(sample) > self.budget or sample.num_terms > self.budget:
            self.on_drop(sample, f"oversize: {len(sample)} tokens > token_budget {self.budget}")
            return []
        out = []
        row = self._place(sample)
        if row is None:
            out.append(self._close())
            row = self._place(sample)
            assert row is not None  # a fresh row takes any sample within the budget
        self.rows[row].add(sample)
        return out

    def _close_if_at_max(self) -> list[MicroBatch]:
        if self.max_samples and self.num_samples >= self.max_samples and self._all_rows_used():
            return [self._close()]
        return []

    def _room_for(self, group: list[Sample]) -> bool:
        """The open rows have room for the whole group: its unique tokens (less a prefix a row
        already holds, such as a shared system prompt) and its loss terms."""
        if self.max_samples and self.num_samples + len(group) > self.max_samples:
            return False
        probe = TreeRow()
        for sample in group:
            probe.add(sample)
        shared = min(max(r.shared_prefix(group[0]) for r in self.rows), group[0].prompt_length)
        free_tokens = sum(self.budget - len(r) for r in self.rows)
        free_terms = sum(self.budget - r.trained for r in self.rows)
        return len(probe) - shared <= free_tokens and probe.trained <= free_terms

    def _place(self, sample: Sample) -> int | None:
        fitting = [i for i, r in enumerate(self.rows) if r.fits(sample, self.budget)]
        with_group = [i for i, r in enumerate(self.rows) if sample.group_id in r.groups]
        own = [i for i in fitting if i in with_group]
        if own:
            return min(own, key=lambda i: (self.rows[i].load, i))
        if with_group and self._all_rows_used():
            return None
        if fitting:
            return min(fitting, key=lambda i: (self.rows[i].load, i))
        return None

    def _all_rows_used(self) -> bool:
        return all(r.samples for r in self.rows)

    def _close(self) -> MicroBatch:
        assert self._all_rows_used(), "a micro-batch never has an empty row"
        batch = collate(self.rows)
        self.rows = [TreeRow() for _ in range(self.num_rows)]
        return batch

    def evict(self, predicate: Callable[[Sample], bool]) -> list[Sample]:
        """Remove open samples matching `predicate` (e.g. stale after a version bump).

        Survivors keep their rows, so every row still fits its budget."""
        evicted, rows = [], []
        for old in self.rows:
            row = TreeRow()
            for s in old.samples:
                if predicate(s):
                    evicted.append(s)
                else:
                    row.add(s)
            rows.append(row)
        self.rows = rows
        return evicted

    def flush(self) -> MicroBatch | None:
        """Close what is open, when every row can be non-empty; else keep it."""
        if self.num_samples < self.num_rows:
            return None
        if not self._all_rows_used():
            samples = [s for r in self.rows for s in r.samples]
            self.rows = _place_groups(_group(samples), self.num_rows)
        return self._close()


def _group(samples: Iterable[Sample]) -> list[list[Sample]]:
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s)
    return list(groups.values())


def _place_groups(groups: list[list[Sample]], num_rows: int) -> list[TreeRow]:
    """Split the largest group until there are P, then place costliest first (LPT)."""
    groups = [list(g) for g in groups]
    while len(groups) < num_rows:
        big = max(range(len(groups)), key=lambda i: (len(groups[i]), -i))
        g = groups.pop(big)
        if len(g) < 2:
            raise ValueError("fewer samples than rows")
        groups += [g[: len(g) // 2], g[len(g) // 2:]]
    priced = []
    for g in groups:
        probe = TreeRow()
        for s in g:
            probe.add(s)
        priced.append((probe.load, g))
    rows = [TreeRow() for _ in range(num_rows)]
    for _, g in sorted(priced, key=lambda x: -x[0]):
        target = min(range(num_rows), key=lambda i: (rows[i].load, i))
        for s in g:
            rows[target].add(s)
    return rows


class FixedCountBatcher:
    """`token_budget <= 0`: buffer bs x P samples, keep groups whole, balance by load."""

    def __init__(self, num_rows: int, batch_size: int) -> None:
        self.num_rows, self.batch_size = num_rows, batch_size
        self.pending: list[Sample] = []

    @property
    def num_samples(self) -> int:
        return len(self.pending)

    @property
    def open_samples(self) -> list[Sample]:
        return list(self.pending)

    def add_group(self, group: list[Sample]) -> list[MicroBatch]:
        """Add a whole group; a micro-batch closes at the first group boundary at or past bs x P."""
        self.pending += group
        if len(self.pending) < self.batch_size * self.num_rows:
            return []
        return [self._close()]

    def evict(self, predicate: Callable[[Sample], bool]) -> list[Sample]:
        """Remove pending samples matching `predicate`."""
        evicted = [s for s in self.pending if predicate(s)]
        self.pending = [s for s in self.pending if not predicate(s)]
        return evicted

    def add(self, sample: Sample) -> list[MicroBatch]:
        self.pending.append(sample)
        if len(self.pending) < self.batch_size * self.num_rows:
            return []
        return [self._close()]

    def _close(self) -> MicroBatch:
        rows = _place_groups(_group(self.pending), self.num_rows)
        self.pending = []
        return collate(rows)

    def flush(self) -> MicroBatch | None:
        if len(self.pending) < self.num_rows:
            return None
        return self._close()


def make_batcher(budget: int, num_rows: int, batch_size: int, on_drop: DropFn | None = None,
                 max_samples: int | None = None) -> TokenBudgetBatcher | FixedCountBatcher:
    """Rows within `budget` tokens; <= 0: a fixed count of batch_size x rows samples (TRL's choice)."""
    if budget <= 0:
        return FixedCountBatcher(num_rows, batch_size)
    return TokenBudgetBatcher(num_rows, budget, on_drop, max_samples)


def iter_batches(batcher, samples: Iterable[Sample]) -> Iterator[MicroBatch]:
    """Drive a batcher over a finite stream (tests, benchmarks), flushing at the end."""
    for s in samples:
        yield from batcher.add(s)
    last = batcher.flush()
    if last is not None:
        yield last
