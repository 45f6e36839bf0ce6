"""RateWindow: the generation tokens/s gauge's window (a running sum, same numbers as a full re-sum)."""

import random

import pytest

from agrpo.services.rollout.metrics import RateWindow


def resum(events, now, window_s):
    """The old computation: keep the last window_s seconds, re-sum everything."""
    kept = [(t, n) for t, n in events if now - t <= window_s]
    span = now - kept[0][0] if len(kept) > 1 else 0.0
    return sum(n for _, n in kept) / span if span > 0 else None


def test_first_event_has_no_rate():
    assert RateWindow().add(5.0, 100) is None


def test_rate_over_the_span():
    w = RateWindow(10.0)
    w.add(0.0, 100)
    assert w.add(2.0, 100) == pytest.approx(100.0)  # 200 tokens over 2 s


def test_old_events_leave_the_window():
    w = RateWindow(10.0)
    w.add(0.0, 1000)
    w.add(5.0, 10)
    assert w.add(12.0, 10) == pytest.approx(20 / 7)  # the event at 0 s is gone
    assert w.total == 20


def test_same_instant_gives_no_rate():
    w = RateWindow(10.0)
    w.add(1.0, 3)
    assert w.add(1.0, 3) is None


def test_matches_a_full_resum():
    rng = random.Random(0)
    w, events, now = RateWindow(10.0), [], 0.0
    for _ in range(2000):
        now += rng.choice([0.0, 0.001, 0.3, 2.5])
        n = rng.randrange(1, 600)
        events.append((now, n))
        got, want = w.add(now, n), resum(events, now, 10.0)
        assert (got is None) == (want is None)
        if want is not None:
            assert got == pytest.approx(want)
