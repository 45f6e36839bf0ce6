"""Score finished groups through the reward service (gRPC), off the generation path.

Each Score call has a deadline; UNAVAILABLE and DEADLINE_EXCEEDED are retried
with back-off up to `scoring_retries` times, then `ScoringFailed` tells the
engine to re-issue the group's prompt later. Anything else (INVALID_ARGUMENT,
...) fails at once: retrying the same request would not help.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import grpc
from google.protobuf import json_format, struct_pb2

from agrpo.services.common.logging import get_logger
from agrpo.services.common.preflight import StartupError
from agrpo.services.common.timeouts import RECONNECT_MAX_S
from agrpo.v1 import reward_service_pb2 as reward_pb
from agrpo.v1 import reward_service_pb2_grpc as reward_grpc

log = get_logger("rollout.scoring")
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
FAILED_STATUSES = (reward_pb.SCORE_STATUS_FAILED, reward_pb.SCORE_STATUS_TIMEOUT)


class ScoringFailed(RuntimeError):
    """The reward service could not score a group; `permanent` when retrying cannot help."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass
class GroupScores:
    """Rewards of one group: totals and per-function values (NaN where not OK)."""

    totals: list[float]
    components: dict[str, list[float]]
    latency_ms: float = 0.0
    errors: list[dict[str, str]] | None = None
    """Per item: function -> reason where it FAILED or TIMED OUT (None: none failed)."""


def to_text(value) -> reward_pb.Text:
    """Plain text or a list of {role, content} messages as a reward Text."""
    if isinstance(value, str):
        return reward_pb.Text(text=value)
    msgs = [reward_pb.ChatMessage(role=str(m.get("role", "")), content=str(m.get("content") or ""),
                                  name=str(m.get("name") or "")) for m in value]
    return reward_pb.Text(messages=reward_pb.Conversation(messages=msgs))


def to_value(obj) -> struct_pb2.Value:
    return json_format.ParseDict(obj, struct_pb2.Value())


def build_request(request_id: str, prompt, completions: list, completion_ids: list[list[int]],
                  columns: dict) -> reward_pb.ScoreRequest:
    """One ScoreRequest for a group: the same prompt and columns for every completion."""
    cols = {k: to_value(v) for k, v in columns.items()}
    items = [reward_pb.ScoreItem(prompt=to_text(prompt), completion=to_text(c), completion_ids=ids,
                                 columns=cols)
             for c, ids in zip(completions, completion_ids)]
    return reward_pb.ScoreRequest(request_id=request_id, items=items)


def parse_response(resp: reward_pb.ScoreResponse, n: int) -> GroupScores:
    """Totals and per-function values; a function that was not OK reads as NaN."""
    if len(resp.items) != n:
        raise ScoringFailed(f"reward service returned {len(resp.items)} items for {n}")
    components: dict[str, list[float]] = {}
    errors: list[dict[str, str]] = [{} for _ in range(n)]
    for i, item in enumerate(resp.items):
        for fs in item.scores:
            vals = components.setdefault(fs.name, [math.nan] * n)
            vals[i] = fs.value if fs.status == reward_pb.SCORE_STATUS_OK else math.nan
            if fs.status in FAILED_STATUSES:
                errors[i][fs.name] = (fs.reason or reward_pb.ScoreStatus.Name(fs.status))[:300]
    latency = sum(resp.function_latency_ms.values())
    return GroupScores([item.total for item in resp.items], components, latency,
                       errors if any(errors) else None)


class Scorer:
    """Calls RewardService.Score with a deadline and bounded retries."""

    def __init__(self, channel: grpc.aio.Channel, *, deadline_s: float, retries: int,
                 backoff_s: float = 0.5) -> None:
        self.stub = reward_grpc.RewardServiceStub(channel)
        self.deadline_s = deadline_s
        self.retries = retries
        self.backoff_s = backoff_s

    async def check_columns(self, columns: set[str]) -> None:
        """Each function the reward service applies finds its columns in the dataset
        (StartupError naming the function, the column and the columns present)."""
        resp = await self.stub.ListRewardFunctions(reward_pb.ListRewardFunctionsRequest(), timeout=self.deadline_s)
        for fn in resp.functions:
            missing = [c for c in fn.required_columns if c not in columns]
            if fn.default_enabled and missing:
                raise StartupError(f"reward function {fn.name!r} needs dataset column {missing[0]!r}; the "
                                   f"dataset has: {', '.join(sorted(columns)) or 'no columns besides the prompt'}")

    async def score(self, request: reward_pb.ScoreRequest) -> GroupScores:
        """Scores for a request; ScoringFailed when the reward service keeps failing."""
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                resp = await self.stub.Score(request, timeout=self.deadline_s)
                return parse_response(resp, len(request.items))
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE or attempt == self.retries:
                    raise ScoringFailed(f"Score {request.request_id}: {exc.code().name}: {exc.details()}",
                                        permanent=exc.code() not in RETRYABLE) from exc
                log.warning("Score %s: %s, retrying in %.1f s", request.request_id, exc.code().name, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)
        raise AssertionError("unreachable")
