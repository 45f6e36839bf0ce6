"""The pacing rule (services/trainer/pacing.py) and the intake granting by it."""

import pytest

from agrpo.services.trainer.buffer import SampleBuffer
from agrpo.services.trainer.intake import Intake
from agrpo.services.trainer.ledger import Ledger
from agrpo.services.trainer.pacing import Pace


def test_window_is_max_staleness_plus_one_versions_of_whole_groups():
    assert Pace(max_staleness=2, per_step=16, capacity=1024, group_size=8).window == 48
    assert Pace(max_staleness=0, per_step=16, capacity=1024, group_size=8).window == 16
    assert Pace(max_staleness=2, per_step=16, capacity=1024, group_size=8, sync=True).window == 16
    assert Pace(max_staleness=2, per_step=16, capacity=1024, group_size=8, steps_per_version=2).window == 96
    assert Pace(max_staleness=4, per_step=16, capacity=44, group_size=8).window == 40  # whole groups
    assert Pace(max_staleness=4, per_step=16, capacity=1024, fixed_window=20).window == 20


def test_room_opens_only_when_a_version_is_published():
    pace = Pace(max_staleness=1, per_step=16, capacity=1024, group_size=8)
    assert pace.room(buffered=0, outstanding=0) == 32
    # 32 generated and buffered; the trainer takes 16 for a step: nothing new to grant yet.
    pace.consume(16)
    assert pace.room(buffered=16, outstanding=0) == 0
    # Version published (nothing carried): one step's room opens.
    pace.published()
    assert pace.room(buffered=16, outstanding=0) == 16
    # A consumed sample that leaves untrained frees its room at once.
    pace.consume(4)
    pace.release(1)
    assert pace.room(buffered=12, outstanding=16) == 1


@pytest.mark.parametrize("schedule, ranks, window", [("async", 1, 3 * 16), ("async", 2, 3 * 32), ("sync", 2, 32)])
def test_the_window_is_what_max_staleness_plus_one_steps_train_on_every_rank(schedule, ranks, window):
    """A step trains per_device_train_batch_size x gradient_accumulation_steps x ranks samples."""
    from agrpo.services.common.config import AgrpoConfig
    from agrpo.services.trainer.app import build_pace

    cfg = AgrpoConfig(per_device_train_batch_size=4, gradient_accumulation_steps=4, max_staleness=2,
                      num_generations=8, trainer={"schedule": schedule, "num_processes": ranks})
    pace = build_pace(cfg, ranks=ranks)
    assert pace.per_step == 16 * ranks and pace.window == window


def test_a_step_is_whole_groups_and_inflight_follows_it():
    from agrpo.services.common.config import AgrpoConfig

    cfg = AgrpoConfig(per_device_train_batch_size=12, num_generations=8, max_staleness=4)
    assert cfg.samples_per_step() == 16 and cfg.samples_per_step(ranks=2) == 24
    assert cfg.resolved_max_inflight_tasks == 4 * 16
    assert AgrpoConfig(per_device_train_batch_size=32, max_staleness=0).resolved_max_inflight_tasks == 32


def _drain(stream):
    out = []
    while not stream.outbox.empty():
        out.append(stream.outbox.get_nowait())
    return out


async def test_intake_grants_the_window_and_more_only_after_publish(make_sample):
    buf = SampleBuffer(100)
    pace = Pace(max_staleness=1, per_step=4, capacity=100, group_size=2)
    intake = Intake(buf, Ledger(), pace)
    st = intake.open("p", 0)
    assert _drain(st)[0].credits == 8
    for i in range(8):
        intake.receive(st, make_sample(f"s{i}", f"g{i // 2}", [1], [2 + i]))
    _drain(st)
    for _ in range(4):  # one step's samples taken by the loop
        buf.pop()
        pace.consume()
    intake.regrant()
    assert _drain(st) == []
    intake.version_moved()  # weights snapshotted, still on their way to vLLM
    intake.regrant()
    assert _drain(st) == []  # no room until the version is live
    intake.version_published()
    (msg,) = _drain(st)
    assert msg.credits == 4


def test_consumption_during_an_overlapped_push_counts_against_the_new_version():
    """The next step trains while the push is in flight: what it takes is the new version's,
    so the room that opens once the weights are live is the window minus that."""
    pace = Pace(max_staleness=2, per_step=4, capacity=100, group_size=4)
    pace.consume(4)
    pace.version_moved()
    assert pace.room(buffered=0, outstanding=0) == 0  # holding: the weights are not in vLLM yet
    pace.consume(4)  # the next step took its samples during the push
    pace.version_live()
    assert pace.room(buffered=0, outstanding=0) == pace.window - 4 == 8
