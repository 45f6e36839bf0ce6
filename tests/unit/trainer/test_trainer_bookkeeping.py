"""Buffer, ledger and intake: staleness, dedupe, credits, epochs, resume point."""

from __future__ import annotations

import pytest

from services.common.versions import is_stale
from services.trainer.buffer import SampleBuffer
from services.trainer.intake import Intake
from services.trainer.ledger import Ledger
from services.trainer.sample import Outcome


def test_staleness_rule(make_sample):
    s = make_sample("a", "g", [1], [2], version=3)
    assert not is_stale(7, s.policy_version, max_staleness=4)
    assert is_stale(8, s.policy_version, max_staleness=4)


async def test_buffer_pop_fresh_skips_stale(make_sample):
    buf = SampleBuffer(4)
    buf.put(make_sample("old", "g", [1], [2], version=0))
    buf.put(make_sample("new", "g", [1], [3], version=5))
    fresh, stale = buf.pop_fresh(lambda s: is_stale(6, s.policy_version, max_staleness=2))
    assert fresh.sample_id == "new" and [s.sample_id for s in stale] == ["old"]
    assert len(buf) == 0 and not await buf.wait_nonempty(0.01)


def test_ledger_epochs_count_distinct_prompts(make_sample):
    led = Ledger(prompts_per_epoch=2)
    led.record([make_sample("a", "g0", [1], [2], key=(0, 0)), make_sample("b", "g0", [1], [3], key=(0, 0))])
    assert led.prompts_trained == 1 and led.completed_epochs == 0
    led.record([make_sample("c", "g1", [1], [2], key=(1, 0))])
    led.record([make_sample("d", "g2", [1], [2], key=(0, 1))])
    assert led.completed_epochs == 1
    assert led.unfinished_keys() == [(0, 1)]
    assert led.target_prompts(1.5) == 3 and led.reached(1.5)
    again = Ledger.from_dict(led.to_dict())
    assert again.trained_ids == led.trained_ids and again.completed_epochs == 1
    assert again.unfinished_keys() == [(0, 1)]


def _drain(stream):
    out = []
    while not stream.outbox.empty():
        out.append(stream.outbox.get_nowait())
    return out


async def test_intake_credits_dedupe_and_routing(make_sample):
    buf, led = SampleBuffer(3), Ledger()
    intake = Intake(buf, led, max_tokens=lambda: 10)
    stream = intake.open("p1", prompts_per_epoch=5)
    first = _drain(stream)
    assert first[0].first and first[0].credits == 3 and led.prompts_per_epoch == 5
    s = make_sample("a", "g", [1, 2], [3])
    assert intake.receive(stream, s) is Outcome.ACCEPTED
    again = intake.receive(stream, make_sample("a", "g", [1, 2], [3]))
    assert again is Outcome.ACCEPTED and len(buf) == 1  # still pending: not buffered twice
    big = intake.receive(stream, make_sample("big", "g", list(range(20)), [3]))
    assert big is Outcome.REJECTED
    msgs = _drain(stream)
    assert [m.acks[0].outcome for m in msgs] == [Outcome.ACCEPTED, Outcome.ACCEPTED, Outcome.REJECTED]
    assert [m.credits for m in msgs] == [0, 1, 1]  # re-send and reject return their credit
    # Trained: ack routed by producer id to the producer's *current* stream.
    buf.pop()
    led.record([s])
    newer = intake.open("p1", 0)
    assert stream.outbox.get_nowait() is None  # the old stream is told to end
    _drain(newer)
    intake.settle([s], Outcome.TRAINED)
    (msg,) = _drain(newer)
    assert msg.acks[0].outcome is Outcome.TRAINED
    assert intake.receive(newer, make_sample("a", "g", [1, 2], [3])) is Outcome.DUPLICATE
    assert "trained" in _drain(newer)[0].acks[0].reason


async def test_intake_regrants_freed_slots(make_sample):
    buf = SampleBuffer(2)
    intake = Intake(buf, Ledger())
    st = intake.open("p", 0)
    _drain(st)
    intake.receive(st, make_sample("a", "g", [1], [2]))
    intake.receive(st, make_sample("b", "g", [1], [3]))
    _drain(st)
    intake.regrant()
    assert _drain(st) == []  # buffer full, nothing to grant
    buf.pop()
    intake.regrant()
    (msg,) = _drain(st)
    assert msg.credits == 1
    intake.finish()
    assert _drain(st)[0].done


@pytest.mark.parametrize("mask,reason", [([1, 1, 0], "length"), ([0, 0], "no trained")])
def test_invalid_samples(make_sample, mask, reason):
    s = make_sample("x", "g", [1], [2])
    s.completion_mask = mask
    assert reason in s.validate()


async def test_duplicate_while_in_a_batch(make_sample):
    buf = SampleBuffer(4)
    intake = Intake(buf, Ledger())
    st = intake.open("p", 0)
    s = make_sample("a", "g", [1], [2])
    intake.receive(st, s)
    buf.pop()  # taken by the planner, not trained yet
    _drain(st)
    assert intake.receive(st, make_sample("a", "g", [1], [2])) is Outcome.ACCEPTED  # not final: keep it
    (msg,) = _drain(st)
    assert msg.credits == 1 and "TRAINED follows" in msg.acks[0].reason and len(buf) == 0
    intake.settle([s], Outcome.DROPPED_STALE)
    assert intake.receive(st, make_sample("a", "g", [1], [2])) is Outcome.ACCEPTED  # re-sent after a drop
