"""Rank 0's commands to the other trainer ranks, through a real c10d TCPStore in-process."""

from __future__ import annotations

import threading
import time

import pytest

from agrpo.services.trainer import ranks


@pytest.fixture
def store():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)


def test_commands_arrive_in_order_after_any_wait(store):
    leader, follower = ranks.Commands(store), ranks.Commands(store)
    got = []
    reader = threading.Thread(target=lambda: got.extend(follower.take(1, lambda: False) for _ in range(3)))
    reader.start()
    time.sleep(0.3)  # the follower waits with no timeout of its own
    for n, command in enumerate([("build", "m", None), ("step", [1, 2], {3: 0}), ("stop",)]):
        leader.post(command)
        while follower.taken == n:  # as in training: the next command once this one's collective ran
            time.sleep(0.01)
    reader.join(5)
    assert got == [("build", "m", None), ("step", [1, 2], {3: 0}), ("stop",)]
    assert not store.check(["agrpo/cmd/0"])  # taken by every rank: deleted


def test_a_follower_gives_up_only_when_told(store):
    follower = ranks.Commands(store)
    calls = []
    assert follower.take(1, lambda: calls.append(1) or len(calls) > 3) is None and len(calls) == 4


def test_behind_names_ranks_that_never_started_the_last_command(store):
    leader, one = ranks.Commands(store), ranks.Commands(store)
    leader.post(("step",))
    one.take(1, lambda: False)
    leader.post(("weights",))
    one.take(1, lambda: False)
    assert leader.behind(3) == [2]  # rank 2 never took a command
    leader.post(("save",))
    assert leader.behind(3) == [1, 2]


def test_silent_ranks_are_those_that_stop_beating_while_idle(store, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(ranks.time, "monotonic", lambda: now[0])
    group = ranks.RankGroup(ranks.World(0, 3))
    group._commands = ranks.Commands(store)
    store.add("agrpo/beat/1", 1)
    store.add("agrpo/beat/2", 1)
    assert group.silent(30) == []  # first look: counts recorded
    now[0] = 120.0
    store.add("agrpo/beat/1", 1)  # rank 1 still beats, rank 2 has not for 20 s
    assert group.silent(30) == []
    now[0] = 140.0
    store.add("agrpo/beat/1", 1)
    assert group.silent(30) == [2]
    group._busy = True  # inside a command nobody beats: not a sign of trouble
    assert group.silent(30) == []


def test_a_clean_exit_destroys_the_process_group_a_failed_one_leaves_it(monkeypatch):
    import torch.distributed as dist

    from agrpo.services.common.ports import free_port

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    dist.init_process_group("gloo")
    try:
        assert ranks.leave(1) == 1 and dist.is_initialized()  # a broken group is not torn down
        assert ranks.leave(0) == 0 and not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
