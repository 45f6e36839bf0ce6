"""Buffer, ledger and intake: staleness, dedupe, credits, epochs, resume point."""

from __future__ import annotations

import pytest

from agrpo.services.common.versions import Lineage
from agrpo.services.trainer.buffer import SampleBuffer
from agrpo.services.trainer.intake import AdmitAll, Intake
from agrpo.services.trainer.ledger import Ledger
from agrpo.services.trainer.sample import Outcome
from trainer_helpers import Limits

is_stale = Lineage().stale  # the rule the trainer uses, on a lineage without restarts


def test_staleness_rule(make_sample):
    s = make_sample("a", "g", [1], [2], version=3)
    assert not is_stale(7, s.policy_version, max_staleness=4)
    assert is_stale(8, s.policy_version, max_staleness=4)


async def test_buffer_pop_fresh_skips_stale(make_sample):
    buf = SampleBuffer(4)
    buf.put(make_sample("old", "g0", [1], [2], version=0))
    buf.put(make_sample("new", "g1", [1], [3], version=5))
    fresh, stale = buf.pop_fresh(lambda g: is_stale(6, g[0].policy_version, max_staleness=2))
    assert [s.sample_id for s in fresh] == ["new"] and [s.sample_id for s in stale] == ["old"]
    assert len(buf) == 0 and not await buf.wait_nonempty(0.01)


async def test_buffer_holds_a_group_until_its_last_row(make_sample):
    buf = SampleBuffer(8)
    rows = [make_sample(f"g-{i}", "g", [1], [2 + i], version=3 - i, size=3) for i in range(3)]
    for row in rows[:2]:
        assert buf.put(row)
    assert len(buf) == 2 and buf.gathering == 2 and buf.pop() is None
    buf.put(rows[2])
    assert await buf.wait_nonempty(0.01) and buf.gathering == 0
    assert [s.sample_id for s in buf.pop()] == ["g-0", "g-1", "g-2"] and len(buf) == 0


def test_buffer_orders_groups_by_their_oldest_row(make_sample):
    buf = SampleBuffer(8)
    for sid, group, version in (("a0", "a", 4), ("a1", "a", 4), ("b0", "b", 5), ("b1", "b", 2)):
        buf.put(make_sample(sid, group, [1], [2], version=version, size=2))
    assert [s.sample_id for s in buf.pop()] == ["b0", "b1"]


def test_a_refused_row_leaves_its_group_and_an_off_lineage_row_dooms_it(make_sample):
    buf = SampleBuffer(8)
    buf.put(make_sample("a0", "a", [1], [2], size=2))
    buf.expect_fewer(make_sample("a1", "a", [1], [2], size=2))
    group = buf.pop()
    assert [s.sample_id for s in group] == ["a0"] and group[0].group_size == 1  # trains with what it has
    buf.put(make_sample("b0", "b", [1], [2], size=3))
    assert [s.sample_id for s in buf.doom("b")] == ["b0"] and len(buf) == 0
    assert not buf.put(make_sample("b1", "b", [1], [2], size=3)) and len(buf) == 0


def test_incomplete_groups_leave_with_their_producer_or_when_stale(make_sample):
    buf = SampleBuffer(8)
    buf.put(make_sample("a0", "a", [1], [2], size=2, producer="p1", version=1))
    buf.put(make_sample("b0", "b", [1], [2], size=2, producer="p2", version=5))
    assert [s.sample_id for s in buf.discard_incomplete("p1")] == ["a0"] and len(buf) == 1
    assert buf.evict_incomplete(lambda g: g[0].policy_version < 5) == []
    assert [s.sample_id for s in buf.evict_incomplete(lambda g: True)] == ["b0"] and len(buf) == 0


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
    intake = Intake(buf, led)
    intake.bind_limits(Limits(tokens=10))
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


async def test_a_producer_that_reconnects_sends_its_incomplete_group_again(make_sample):
    buf = SampleBuffer(8)
    intake = Intake(buf, Ledger())
    stream = intake.open("p1", 0)
    rows = [make_sample(f"g-{i}", "g", [1], [2], size=3) for i in range(3)]
    for row in rows[:2]:
        assert intake.receive(stream, row) is Outcome.ACCEPTED
    intake.close(stream)  # the stream broke mid-group: nothing of it stays
    assert len(buf) == 0 and not intake.pending
    again = intake.open("p1", 0)
    assert [intake.receive(again, r) for r in rows] == [Outcome.ACCEPTED] * 3  # fresh, not "already pending"
    assert [s.sample_id for s in buf.pop()] == ["g-0", "g-1", "g-2"]


async def test_an_off_lineage_row_drops_its_whole_group(make_sample):
    buf = SampleBuffer(8)
    class OffLineage(AdmitAll):
        def version_problem(self, sample):
            return "off the lineage" if sample.sample_id == "g-1" else None

    intake = Intake(buf, Ledger(), hooks=OffLineage())
    stream = intake.open("p1", 0)
    _drain(stream)
    outcomes = [intake.receive(stream, make_sample(f"g-{i}", "g", [1], [2], size=3, producer="p1"))
                for i in range(3)]
    assert outcomes == [Outcome.ACCEPTED, Outcome.DROPPED_STALE, Outcome.DROPPED_STALE]
    acks = [a for m in _drain(stream) for a in m.acks]
    assert {a.sample_id for a in acks if a.outcome is Outcome.DROPPED_STALE} == {"g-0", "g-1", "g-2"}
    assert len(buf) == 0 and not intake.pending
