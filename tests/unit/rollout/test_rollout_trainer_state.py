"""The rollout's TrainerStateHook: given at construction, told when the trainer goes silent."""

from __future__ import annotations

import asyncio

import grpc

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.rollout.app import RolloutApp
from agrpo.services.rollout.server import RolloutService
from agrpo.services.rollout.trainer_link import TrainerLiveness, TrainerStateHook, heartbeat_loop
from agrpo.v1 import common_pb2


class Hook:
    """A fake TrainerStateHook that keeps what it is told."""

    def __init__(self) -> None:
        self.states: list[bool] = []
        self.told = asyncio.Event()

    async def on_trainer_state(self, stale: bool) -> None:
        self.states.append(stale)
        self.told.set()


def test_the_service_implements_the_hook():
    assert issubclass(RolloutService, TrainerStateHook)


async def test_the_app_keeps_the_hook_it_is_given():
    hook = Hook()
    assert isinstance(hook, TrainerStateHook)
    assert RolloutApp(AgrpoConfig(), trainer_state=hook).trainer_state is hook


async def test_a_silent_trainer_is_reported_to_the_hook():
    hook = Hook()
    async with grpc.aio.insecure_channel("127.0.0.1:9") as channel:  # nothing listens: never heard
        task = asyncio.create_task(heartbeat_loop(channel, common_pb2.HeartbeatRequest, TrainerLiveness(0.0),
                                                  0.05, hook))
        await asyncio.wait_for(hook.told.wait(), 10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert hook.states == [True]
