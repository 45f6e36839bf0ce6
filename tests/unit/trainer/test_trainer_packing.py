"""Prefix-tree packing and planners (TRL 1.16 rules)."""

from __future__ import annotations

from agrpo.services.trainer.packing import FixedCountBatcher, TokenBudgetBatcher, TreeRow, iter_batches, make_batcher


def test_group_shares_prompt_and_forks_one_token_early(make_sample):
    a = make_sample("a", "g", [5, 6, 7], [8, 9])
    b = make_sample("b", "g", [5, 6, 7], [10, 11, 12])
    row = TreeRow()
    row.add(a)
    row.add(b)
    # (5,6) and (6,7) are shared; 7 is keyed by its next token, so it forks there.
    assert len(row) == 5 + 6 - 2
    packed = row.pack()
    assert packed.input_ids == [5, 6, 7, 8, 9, 7, 10, 11, 12]
    assert packed.position_ids == [0, 1, 2, 3, 4, 2, 3, 4, 5]
    assert packed.parent == [-1, 0, 1, 2, 3, 1, 5, 6, 7]
    assert packed.subtree_end == [8, 8, 4, 4, 4, 8, 8, 8, 8]  # pre-order: node 1's subtree is 1..8


def test_terms_are_explicit_and_labels_match(make_sample):
    a = make_sample("a", "g", [5, 6, 7], [8, 9], adv=1.0, old=-1.0)
    b = make_sample("b", "g", [5, 6, 7], [8, 9], adv=-1.0, old=-3.0)  # exact duplicate tokens
    row = TreeRow()
    row.add(a)
    row.add(b)
    packed = row.pack()
    assert len(row) == 5  # duplicates share every node, leaf included
    # Two terms per sample (positions 3 and 4), on the same packed positions.
    assert packed.token_index == [2, 3, 2, 3]
    assert packed.labels == [8, 9, 8, 9]
    assert packed.advantages == [1.0, 1.0, -1.0, -1.0]
    assert packed.old_logprobs == [-1.0, -1.0, -3.0, -3.0]
    assert packed.segment_id == [0, 0, 1, 1]
    assert packed.sample_position == [2, 3, 2, 3]
    assert packed.shift_labels == [-100, -100, 8, 9, -100]


def test_mask_at_position_zero_is_not_a_term(make_sample):
    s = make_sample("a", "g", [], [4, 5, 6])
    assert s.num_terms == 2
    assert TreeRow().pack().num_terms == 0
    row = TreeRow()
    row.add(s)
    assert row.pack().num_terms == 2


def test_load_is_tree_attention_cost(make_sample):
    row = TreeRow()
    row.add(make_sample("a", "g", [1, 2, 3], [4]))
    assert row.load == 1 + 2 + 3 + 4  # lone chain of L=4: L(L+1)/2


def test_budget_counts_unique_tokens(make_groups):
    samples = make_groups(n_groups=1, size=4, prompt_len=20, max_completion=3)
    raw = sum(len(s) for s in samples)
    b = TokenBudgetBatcher(1, budget=40)
    batches = list(iter_batches(b, samples))
    assert len(batches) == 1  # raw tokens exceed 40 but unique tokens fit
    assert raw > 40 >= batches[0].num_forward_tokens


def test_budget_caps_loss_terms(make_sample):
    # Identical samples add no tokens, but each adds terms: the row must still close.
    samples = [make_sample(f"s{i}", "g", [1, 2], [3, 4, 5, 6]) for i in range(5)]
    batches = list(iter_batches(TokenBudgetBatcher(1, budget=10), samples))
    assert [mb.num_terms for mb in batches] == [8, 8, 4]


def test_oversize_dropped_with_callback(make_sample):
    dropped = []
    b = TokenBudgetBatcher(1, budget=5, on_drop=lambda s, why: dropped.append((s.sample_id, why)))
    assert b.add(make_sample("big", "g", [1, 2, 3], [4, 5, 6])) == []
    assert dropped and dropped[0][0] == "big" and "oversize" in dropped[0][1]
    assert len(dropped) == 1 and b.num_samples == 0


def test_rows_never_empty_and_group_first(make_groups):
    samples = make_groups(n_groups=3, size=3, prompt_len=6, seed=1)
    batches = list(iter_batches(TokenBudgetBatcher(2, budget=30), samples))
    assert batches
    for mb in batches:
        assert len(mb.rows) == 2 and all(row.samples for row in mb.rows)
    # Every sample was placed exactly once.
    placed = [s.sample_id for mb in batches for s in mb.samples]
    assert sorted(placed) == sorted(s.sample_id for s in samples)
    # A group's samples are steered into one row while it fits.
    first = batches[0]
    for row in first.rows:
        groups = [s.group_id for s in row.samples]
        assert groups == sorted(groups, key=groups.index)


def test_flush_keeps_fewer_samples_than_rows(make_sample):
    b = TokenBudgetBatcher(2, budget=50)
    b.add(make_sample("a", "g", [1, 2], [3]))
    assert b.flush() is None  # one sample cannot fill two rows
    b.add(make_sample("b", "g", [1, 2], [4]))
    mb = b.flush()
    assert mb is not None and all(r.samples for r in mb.rows)


def test_max_samples_closes_micro_batch(make_groups):
    samples = make_groups(n_groups=2, size=4)
    b = TokenBudgetBatcher(1, budget=10_000, max_samples=3)
    sizes = [mb.num_samples for mb in iter_batches(b, samples)]
    assert sizes == [3, 3, 2]


def test_fixed_count_keeps_groups_whole(make_groups):
    samples = make_groups(n_groups=2, size=4)
    b = FixedCountBatcher(2, batch_size=4)
    batches = list(iter_batches(b, samples))
    assert len(batches) == 1
    for row in batches[0].rows:
        assert len({s.group_id for s in row.samples}) == 1


def test_fixed_count_splits_groups_when_fewer_than_rows(make_groups):
    samples = make_groups(n_groups=1, size=4)
    batches = list(iter_batches(FixedCountBatcher(2, batch_size=2), samples))
    assert [len(r.samples) for r in batches[0].rows] == [2, 2]


def test_make_batcher_choice():
    assert isinstance(make_batcher(512, 1, 8), TokenBudgetBatcher)
    assert make_batcher(512, 1, 8).budget == 512
    assert isinstance(make_batcher(0, 1, 8), FixedCountBatcher)


def _by_group(samples):
    groups = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s)
    return list(groups.values())


def test_a_group_that_does_not_fit_moves_whole_to_the_next_micro_batch(make_groups):
    samples = make_groups(n_groups=3, size=4, prompt_len=8, max_completion=6)
    one_group = TreeRow()
    for s in samples[:4]:
        one_group.add(s)
    budget = len(one_group) + 16  # room for one group and a sample of the next, never two groups
    b = TokenBudgetBatcher(1, budget=budget)
    closed = [mb for group in _by_group(samples) for mb in b.add_group(group)]
    closed.append(b.flush())
    assert [sorted({s.group_id for s in mb.samples}) for mb in closed] == [["g0"], ["g1"], ["g2"]]
    # Sample by sample, the same budget splits groups across micro-batches.
    b = TokenBudgetBatcher(1, budget=budget)
    split = list(iter_batches(b, samples))
    assert any(len({s.group_id for s in mb.samples}) > 1 for mb in split)


def test_a_group_larger_than_a_micro_batch_still_spans_several(make_groups):
    samples = make_groups(n_groups=1, size=8, prompt_len=4, max_completion=6)
    b = TokenBudgetBatcher(1, budget=20)
    closed = b.add_group(samples)
    assert closed and b.open_samples  # the loop keeps the open tail in the same step
    assert sum(mb.num_samples for mb in closed) + len(b.open_samples) == 8


def test_fixed_count_closes_at_a_group_boundary(make_groups):
    samples = make_groups(n_groups=3, size=3)
    b = FixedCountBatcher(1, batch_size=4)
    closed = [mb for group in _by_group(samples) for mb in b.add_group(group)]
    assert [mb.num_samples for mb in closed] == [6] and len(b.open_samples) == 3
