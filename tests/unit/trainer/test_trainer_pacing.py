"""The pacing rule (services/trainer/pacing.py) and the intake granting by it."""

import pytest

from agrpo.services.trainer.buffer import SampleBuffer
from agrpo.services.trainer.intake import Intake
from agrpo.services.trainer.ledger import Ledger
from agrpo.services.trainer.pacing import Pace


def test_window_is_max_staleness_plus_one_versions_of_whole_groups():
    assert Pace(max_staleness=2, nominal_per_version=16, capacity=1024, group_size=8).window == 48
    assert Pace(max_staleness=0, nominal_per_version=16, capacity=1024, group_size=8).window == 16
    # Whole groups, never past the bound: 3 x 12 = 36 -> 32 ...
    assert Pace(max_staleness=2, nominal_per_version=12, capacity=1024, group_size=8).window == 32
    # ... except the sync schedule, which trains exactly what it generated: 12 -> 16.
    assert Pace(max_staleness=2, nominal_per_version=12, capacity=1024, group_size=8, sync=True).window == 16
    assert Pace(max_staleness=4, nominal_per_version=16, capacity=40, group_size=8).window == 40
    assert Pace(max_staleness=4, nominal_per_version=16, capacity=1024, fixed_window=20).window == 20


def test_room_opens_only_when_a_version_is_published():
    pace = Pace(max_staleness=1, nominal_per_version=16, capacity=1024, group_size=8)
    assert pace.room(buffered=0, outstanding=0) == 32
    # 32 generated and buffered; the trainer takes 16 for a step: nothing new to grant yet.
    pace.consume(16)
    assert pace.room(buffered=16, outstanding=0) == 0
    # Version published after training 16 (none carried): one step's room opens.
    pace.published(trained=16, carried=0)
    assert pace.room(buffered=16, outstanding=0) == 16
    # A consumed sample that leaves untrained frees its room at once.
    pace.consume(4)
    pace.release(1)
    assert pace.room(buffered=12, outstanding=16) == 1


def test_per_version_follows_the_smallest_recent_version():
    pace = Pace(max_staleness=1, nominal_per_version=16, capacity=1024, group_size=4)
    for trained in (20, 12, 18):
        pace.published(trained=trained, carried=0)
    assert pace.per_version == 12 and pace.window == 24
    sync = Pace(max_staleness=1, nominal_per_version=16, capacity=1024, group_size=4, sync=True)
    sync.published(trained=12, carried=0)
    assert sync.per_version == 16  # the sync schedule always trains one nominal batch


def test_the_first_versions_measured_do_not_widen_the_window_past_nominal():
    """A token budget's steps vary by a group a row: a first step of 40 then steps of 32 would,
    trusted at once, have let generation run past what 3 steps train (a CI demo on two ranks
    dropped 16 of 784 samples as stale that way)."""
    pace = Pace(max_staleness=2, nominal_per_version=16, capacity=1024, group_size=8)
    for trained in (40, 32, 40, 32):
        pace.published(trained=trained, carried=0)
        assert pace.per_version == 16 and pace.window == 48
    pace.published(trained=40, carried=0)  # five versions measured: their smallest
    assert pace.per_version == 32 and pace.window == 96
    two_rows = Pace(max_staleness=2, nominal_per_version=16, capacity=1024, group_size=8, rows=2)
    for _ in range(5):  # steps of 40 on two ranks may be 32 next (a CI demo dropped 3% as stale)
        two_rows.published(trained=40, carried=0)
    assert two_rows.per_version == 32 and two_rows.window == 96


def test_sync_step_is_complete_when_everything_generated_was_taken():
    pace = Pace(max_staleness=3, nominal_per_version=8, capacity=64, group_size=4, sync=True)
    pace.consume(7)
    assert not pace.step_complete()
    pace.consume(1)
    assert pace.step_complete()
    assert not Pace(max_staleness=3, nominal_per_version=8, capacity=64).step_complete()


def _drain(stream):
    out = []
    while not stream.outbox.empty():
        out.append(stream.outbox.get_nowait())
    return out


async def test_intake_grants_the_window_and_more_only_after_publish(make_sample):
    buf = SampleBuffer(100)
    pace = Pace(max_staleness=1, nominal_per_version=4, capacity=100, group_size=2)
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
    intake.version_moved(trained=4, carried=0)  # weights snapshotted, still on their way to vLLM
    intake.regrant()
    assert _drain(st) == []  # no room until the version is live
    intake.version_published()
    (msg,) = _drain(st)
    assert msg.credits == 4


def test_consumption_during_an_overlapped_push_counts_against_the_new_version():
    """The next step trains while the push is in flight: what it takes is the new version's,
    so the room that opens once the weights are live is the window minus that."""
    pace = Pace(max_staleness=2, nominal_per_version=4, capacity=100, group_size=4)
    pace.consume(4)
    pace.version_moved(trained=4, carried=0)
    assert pace.room(buffered=0, outstanding=0) == 0  # holding: the weights are not in vLLM yet
    pace.consume(4)  # the next step took its samples during the push
    pace.version_live()
    assert pace.room(buffered=0, outstanding=0) == pace.window - 4 == 8


@pytest.mark.parametrize("schedule, ranks, window", [("async", 1, 3 * 16), ("async", 2, 3 * 32), ("sync", 2, 32)])
def test_the_nominal_batch_counts_every_ranks_rows(schedule, ranks, window):
    """TRL's step is per_device_train_batch_size x num_processes samples a micro-batch: on two ranks
    the window a version opens before any is measured is twice one rank's."""
    from agrpo.services.common.config import AgrpoConfig
    from agrpo.services.trainer.app import build_pace

    cfg = AgrpoConfig(per_device_train_batch_size=16, max_staleness=2, num_generations=8,
                      trainer={"schedule": schedule, "num_processes": ranks})
    pace = build_pace(cfg, rows=ranks)
    assert pace.nominal_per_version == 16 * ranks and pace.window == window
