"""Helpers for the reward-service tests: configs, a running server, request builders."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from google.protobuf import struct_pb2

from agrpo.services.common.channels import open_channel
from agrpo.services.common.config import AgrpoConfig
from agrpo.services.reward.server import RewardService, build
from agrpo.v1 import reward_service_pb2 as pb
from agrpo.v1 import reward_service_pb2_grpc as reward_grpc

HERE = Path(__file__).resolve().parent
SERVICE = "agrpo.v1.RewardService"
OK, NA, FAILED, TIMEOUT = (pb.SCORE_STATUS_OK, pb.SCORE_STATUS_NOT_APPLICABLE,
                           pb.SCORE_STATUS_FAILED, pb.SCORE_STATUS_TIMEOUT)


def make_cfg(reward_funcs: list[dict[str, Any]], **reward: Any) -> AgrpoConfig:
    """A config with a free port, no metrics endpoint, and the given functions."""
    section = {"port": 0, "metrics_port": None, "num_workers": 2, "call_timeout_s": 30.0, **reward}
    extra = section.pop("top", {})
    return AgrpoConfig.model_validate({"reward_funcs": reward_funcs, "reward": section, **extra})


@contextlib.asynccontextmanager
async def running(cfg: AgrpoConfig) -> AsyncIterator[RewardService]:
    """A started in-process server, stopped on exit."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    server = await build(cfg)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def client(port: int, **kwargs: Any) -> AsyncIterator[reward_grpc.RewardServiceStub]:
    """A RewardService stub over a real channel to localhost:port."""
    channel = open_channel(f"localhost:{port}", [SERVICE], deadline_s=60.0, **kwargs)
    try:
        yield reward_grpc.RewardServiceStub(channel)
    finally:
        await channel.close()


def text(value: str | list[dict[str, str]]) -> pb.Text:
    """Standard (str) or conversational (message dicts) Text."""
    if isinstance(value, str):
        return pb.Text(text=value)
    return pb.Text(messages=pb.Conversation(messages=[pb.ChatMessage(**m) for m in value]))


def item(completion: str | list[dict[str, str]], prompt: Any = None, ids: tuple[int, ...] = (),
         **columns: Any) -> pb.ScoreItem:
    """One ScoreItem; keyword arguments become dataset columns."""
    out = pb.ScoreItem(completion=text(completion), completion_ids=list(ids))
    if prompt is not None:
        out.prompt.CopyFrom(text(prompt))
    struct = struct_pb2.Struct()
    struct.update(columns)
    for key in columns:
        out.columns[key].CopyFrom(struct.fields[key])
    return out


def request(items: list[pb.ScoreItem], *functions: str | tuple[str, float],
            request_id: str = "r") -> pb.ScoreRequest:
    """A ScoreRequest naming functions (optionally with weights)."""
    refs = [pb.RewardFunctionRef(name=f) if isinstance(f, str)
            else pb.RewardFunctionRef(name=f[0], weight=f[1]) for f in functions]
    return pb.ScoreRequest(request_id=request_id, items=items, functions=refs)


def column(response: pb.ScoreResponse, name: str) -> list[tuple[int, float]]:
    """(status, value) of function `name` on every item."""
    out = []
    for it in response.items:
        (score,) = [s for s in it.scores if s.name == name]
        out.append((score.status, score.value))
    return out


def values(response: pb.ScoreResponse, name: str) -> list[float | None]:
    """Values of `name` per item; None where the status is not OK."""
    return [v if s == OK else None for s, v in column(response, name)]
