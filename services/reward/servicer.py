"""RewardService over gRPC: proto <-> domain, domain errors -> status codes.

Requests are parsed by tolerant deserializers: bytes that are not a valid message (for
example a string field holding invalid UTF-8, which protobuf refuses to decode) reach
the handler as `Undecodable` and get INVALID_ARGUMENT, instead of gRPC's generic error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from agrpo.v1 import reward_service_pb2 as reward_pb
from agrpo.v1 import reward_service_pb2_grpc as reward_grpc
from services.common.errors import InvalidArgument, ServiceError, Unavailable, grpc_errors
from services.common.logging import get_logger

from . import convert
from .metrics import RewardMetrics
from .scorer import Scorer

SERVICE_NAME = reward_pb.DESCRIPTOR.services_by_name["RewardService"].full_name
log = get_logger("reward.servicer")


@dataclass(frozen=True)
class Undecodable:
    """A request whose bytes did not parse."""

    error: str


def _tolerant(message_cls: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return message_cls.FromString(data)
        except DecodeError as exc:
            return Undecodable(str(exc) or "cannot parse")
    return parse


def _check_decoded(request: Any) -> None:
    if isinstance(request, Undecodable):
        raise InvalidArgument(f"request does not parse ({request.error}); string fields must be "
                              "valid UTF-8")


class RewardServicer(reward_grpc.RewardServiceServicer):
    """Translates RewardService calls for a `Scorer` (None until the workers are up)."""

    def __init__(self, metrics: RewardMetrics) -> None:
        self.metrics = metrics
        self.scorer: Scorer | None = None

    def register(self, server: grpc.aio.Server) -> None:
        """Add our handlers (with tolerant deserializers) to `server`."""
        handlers = {
            "Score": grpc.unary_unary_rpc_method_handler(
                self.Score, request_deserializer=_tolerant(reward_pb.ScoreRequest),
                response_serializer=reward_pb.ScoreResponse.SerializeToString),
            "ScoreStream": grpc.stream_stream_rpc_method_handler(
                self.ScoreStream, request_deserializer=_tolerant(reward_pb.ScoreStreamRequest),
                response_serializer=reward_pb.ScoreStreamResponse.SerializeToString),
            "ListRewardFunctions": grpc.unary_unary_rpc_method_handler(
                self.ListRewardFunctions,
                request_deserializer=_tolerant(reward_pb.ListRewardFunctionsRequest),
                response_serializer=reward_pb.ListRewardFunctionsResponse.SerializeToString),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        server.add_registered_method_handlers(SERVICE_NAME, handlers)

    def _ready(self) -> Scorer:
        if self.scorer is None:
            raise Unavailable("reward workers are starting")
        return self.scorer

    async def _score(self, request: reward_pb.ScoreRequest) -> reward_pb.ScoreResponse:
        scorer = self._ready()
        batch = convert.batch_from_proto(request)
        items, latency = await scorer.score(batch, convert.refs_from_proto(request))
        return convert.response_to_proto(request.request_id, items, latency)

    @grpc_errors
    async def Score(self, request, context):
        """Score one batch."""
        code = "OK"
        try:
            _check_decoded(request)
            return await self._score(request)
        except ServiceError as exc:
            code = exc.code.name
            raise
        except Exception:
            code = "INTERNAL"
            raise
        finally:
            self.metrics.requests.labels("Score", code).inc()

    @grpc_errors
    async def ListRewardFunctions(self, request, context):
        """The functions this server offers."""
        _check_decoded(request)
        return reward_pb.ListRewardFunctionsResponse(
            functions=[convert.info_to_proto(info) for info in self._ready().listed])

    async def _stream_one(self, message: Any) -> reward_pb.ScoreStreamResponse:
        """One stream request; its failure becomes a code in its response, not the stream's."""
        request_id = "" if isinstance(message, Undecodable) else message.request.request_id
        try:
            _check_decoded(message)
            response = await self._score(message.request)
            code, error = grpc.StatusCode.OK, ""
        except ServiceError as exc:
            response = reward_pb.ScoreResponse(request_id=request_id)
            code, error = exc.code, str(exc)
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the stream
            log.exception("ScoreStream request %r failed", request_id)
            response = reward_pb.ScoreResponse(request_id=request_id)
            code, error = grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
        self.metrics.requests.labels("ScoreStream", code.name).inc()
        return reward_pb.ScoreStreamResponse(response=response, code=code.value[0], error=error)

    @grpc_errors
    async def ScoreStream(self, request_iterator, context) -> AsyncIterator[reward_pb.ScoreStreamResponse]:
        """Score requests as they arrive; answer each as soon as it is done.

        One stream keeps at most `capacity` requests in flight and stops reading beyond
        that, so a fast sender meets HTTP/2 flow control rather than RESOURCE_EXHAUSTED."""
        window = asyncio.Semaphore(self._ready().capacity)
        done: asyncio.Queue[reward_pb.ScoreStreamResponse | None] = asyncio.Queue()
        pending: set[asyncio.Task] = set()

        async def one(message: Any) -> None:
            try:
                await done.put(await self._stream_one(message))
            finally:
                window.release()

        async def read() -> None:
            try:
                async for message in request_iterator:
                    await window.acquire()
                    task = asyncio.create_task(one(message))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                while pending:
                    await asyncio.gather(*list(pending), return_exceptions=True)
            finally:
                await done.put(None)

        reader = asyncio.create_task(read())
        try:
            while (response := await done.get()) is not None:
                yield response
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()
