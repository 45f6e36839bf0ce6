"""Reconciliation cases as TRL tests them: clean, realign, fork, early divergence,
large drift then a short next turn, max_iters=0 (a single turn)."""

import pytest

from agrpo.services.rollout.multiturn.reconcile import CLEAN, FORK, REALIGN, Reconciler, reconcile

P = [1, 2, 3]          # initial prompt
A1 = [10, 11, 12]      # first answer
LP1 = [-0.1, -0.2, -0.3]
T = [20, 21]           # tool response / next generation prompt (context)
A2 = [30, 31]
LP2 = [-0.4, -0.5]


def trained(row):
    return [t for t, m in zip(row.ids, row.mask) if m]


def test_single_turn_is_one_row_like_max_iters_zero():
    rows, tally = reconcile([(P, A1, LP1, [0, 0, 0])], 1024)
    assert len(rows) == 1
    r = rows[0]
    assert r.ids == P + A1 and r.mask == [0, 0, 0, 1, 1, 1]
    assert r.logprobs == [0.0] * 3 + LP1
    assert r.spans() == [(0, 3, 6)] and tally.clean == 1


def test_clean_append_stays_one_row():
    rows, tally = reconcile([(P, A1, LP1, [1, 1, 1]), (P + A1 + T, A2, LP2, [1, 2])], 1024)
    assert len(rows) == 1 and tally.clean == 2 and tally.fork == 0
    r = rows[0]
    assert r.ids == P + A1 + T + A2
    assert r.mask == [0] * 3 + [1] * 3 + [0] * 2 + [1] * 2
    assert r.logprobs == [0.0] * 3 + LP1 + [0.0] * 2 + LP2
    assert r.spans() == [(1, 3, 6), (1, 8, 9), (2, 9, 10)]
    assert r.oldest_version() == 1


def test_realign_small_drift_inside_last_answer():
    # The template re-tokenises the end of the answer: 12 -> 13 14.
    prompt2 = P + [10, 11, 13, 14] + T
    rows, tally = reconcile([(P, A1, LP1), (prompt2, A2, LP2)], fork_threshold_tokens=4)
    assert len(rows) == 1 and tally.realign == 1 and tally.drift_tokens == [1]
    r = rows[0]
    assert r.ids == prompt2 + A2
    # 10, 11 still trained; the drifted tail is context; A2 trained.
    assert trained(r) == [10, 11, 30, 31]
    assert r.mask[5:9] == [0, 0, 0, 0]


def test_large_rewrite_forks():
    # The answer is rewritten from its first token (e.g. reasoning dropped): drift 3 >= threshold 2.
    prompt2 = P + [99] + T
    rows, tally = reconcile([(P, A1, LP1), (prompt2, A2, LP2)], fork_threshold_tokens=2)
    assert len(rows) == 2 and tally.fork == 1
    assert trained(rows[0]) == A1 and rows[0].logprobs[3:] == LP1
    assert rows[1].ids == prompt2 + A2 and trained(rows[1]) == A2
    # every generated token trained in exactly one row
    assert sorted(trained(rows[0]) + trained(rows[1])) == sorted(A1 + A2)


def test_early_divergence_forks_even_with_small_drift():
    # Divergence inside the prompt (before the last answer) is never a realign.
    prompt2 = [1, 9, 3] + A1 + T
    rows, tally = reconcile([(P, A1, LP1), (prompt2, A2, LP2)], fork_threshold_tokens=1024)
    assert tally.fork == 1 and len(rows) == 2
    assert rows[1].ids == prompt2 + A2 and rows[1].mask[:len(prompt2)] == [0] * len(prompt2)


def test_large_drift_then_short_next_turn():
    long_answer = list(range(100, 140))
    lps = [-1.0] * 40
    prompt2 = P + [100, 200] + T          # template dropped 39 answer tokens: drift 39 -> fork
    prompt3 = prompt2 + A2 + [50]         # short next turn appends cleanly to the fork row
    rows, tally = reconcile([(P, long_answer, lps), (prompt2, A2, LP2), (prompt3, [60], [-0.6])], 8)
    assert tally.fork == 1 and tally.clean == 2 and tally.drift_tokens == [39]
    assert len(rows) == 2
    assert trained(rows[0]) == long_answer            # kept its signal
    assert trained(rows[1]) == A2 + [60]
    assert rows[1].ids == prompt3 + [60]


def test_rows_without_trained_tokens_are_dropped():
    rec = Reconciler(0)
    rec.add_turn(P, [], [])
    assert rec.rows() == []


def test_output_mask_and_validation():
    rec = Reconciler(10)
    rec.add_turn(P, A1, LP1, [0, 0, 0], output_mask=[1, 0, 1])
    r = rec.rows()[0]
    assert r.mask[3:] == [1, 0, 1] and r.logprobs[3:] == LP1  # TRL keeps a masked token's logprob
    with pytest.raises(ValueError):
        rec.add_turn(P, A1, [-0.1])


def test_threshold_zero_always_forks_on_drift():
    rec = Reconciler(0)
    rec.add_turn(P, A1, LP1)
    assert rec.add_turn(P + [10, 11, 13] + T, A2, LP2) == FORK
    rec2 = Reconciler(0)
    rec2.add_turn(P, A1, LP1)
    assert rec2.add_turn(P + A1 + T, A2, LP2) == CLEAN
    assert REALIGN == "realign"
