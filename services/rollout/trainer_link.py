"""Follow the trainer: its policy versions (WatchPolicy) and its liveness (Heartbeat).

Both loops reconnect with back-off forever; a trainer silent for longer than
`heartbeat_stale_after_s` is reported by `TrainerLiveness` (health, logs, status).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

import grpc

from agrpo.services.common.logging import get_logger
from agrpo.services.common.timeouts import HEARTBEAT_MIN_TIMEOUT_S, RECONNECT_MAX_S
from agrpo.v1 import trainer_service_pb2 as trainer_pb
from agrpo.v1 import trainer_service_pb2_grpc as trainer_grpc

log = get_logger("rollout.trainer_link")


@runtime_checkable
class TrainerStateHook(Protocol):
    """Who is told that the trainer went silent or came back (RolloutService: its health)."""

    async def on_trainer_state(self, stale: bool) -> None:
        """stale: silent for longer than heartbeat_stale_after_s; False: heard from again."""


class TrainerLiveness:
    """When the trainer was last heard from, and whether that is too long ago."""

    def __init__(self, stale_after_s: float) -> None:
        self.stale_after_s = stale_after_s
        self.last_heard = time.monotonic()

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    @property
    def silent_s(self) -> float:
        return time.monotonic() - self.last_heard

    @property
    def stale(self) -> bool:
        return self.silent_s > self.stale_after_s


async def watch_policy(channel: grpc.aio.Channel, watcher_id: str, on_policy, liveness: TrainerLiveness,
                       reconnect_s: float) -> None:
    """Stream policy versions (PolicyVersion messages) into `on_policy` forever."""
    stub = trainer_grpc.TrainerServiceStub(channel)
    delay = reconnect_s
    while True:
        try:
            async for resp in stub.WatchPolicy(trainer_pb.WatchPolicyRequest(watcher_id=watcher_id)):
                liveness.heard()
                delay = reconnect_s
                on_policy(resp.policy)
            log.warning("WatchPolicy ended; reconnecting")
        except grpc.aio.AioRpcError as exc:
            log.debug("WatchPolicy: %s; reconnecting in %.1f s", exc.code().name, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, RECONNECT_MAX_S)


async def heartbeat_loop(channel: grpc.aio.Channel, make_request, liveness: TrainerLiveness,
                         interval_s: float, hook: TrainerStateHook) -> None:
    """Ping the trainer every interval; tell `hook` of every change of its staleness."""
    stub = trainer_grpc.TrainerServiceStub(channel)
    was_stale = False
    while True:
        try:
            await stub.Heartbeat(make_request(), timeout=max(interval_s, HEARTBEAT_MIN_TIMEOUT_S))
            liveness.heard()
        except grpc.aio.AioRpcError:
            pass
        if liveness.stale != was_stale:
            was_stale = liveness.stale
            if was_stale:
                log.warning("trainer silent for %.0f s (> heartbeat_stale_after_s)", liveness.silent_s)
            else:
                log.info("trainer heard from again")
            await hook.on_trainer_state(was_stale)
        await asyncio.sleep(interval_s)
