"""RewardService over gRPC: proto <-> domain, domain errors -> status codes.

Score and ScoreStream take their requests as bytes and parse them only once the
request is admitted (admission.py), so a refusal under overload costs no parsing or
conversion. Bytes that are not a valid message (for example a string field holding
invalid UTF-8, which protobuf refuses to decode) get INVALID_ARGUMENT, instead of
gRPC's generic error. Calls are counted by their final code in call_metrics.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from agrpo.services.common.errors import InvalidArgument, ServiceError, Unavailable, grpc_errors
from agrpo.services.common.logging import get_logger
from agrpo.v1 import reward_service_pb2 as reward_pb
from agrpo.v1 import reward_service_pb2_grpc as reward_grpc

from . import convert
from .metrics import RewardMetrics
from .scorer import Scorer, shown

SERVICE_NAME = reward_pb.DESCRIPTOR.services_by_name["RewardService"].full_name
log = get_logger("reward.servicer")


def _parse(message_cls: Any, data: bytes) -> Any:
    try:
        return message_cls.FromString(data)
    except DecodeError as exc:
        raise InvalidArgument(f"request does not parse ({shown(str(exc) or 'cannot parse')}); "
                              "string fields must be valid UTF-8") from None


class RewardServicer(reward_grpc.RewardServiceServicer):
    """Translates RewardService calls for a `Scorer` (None until the workers are up)."""

    def __init__(self, metrics: RewardMetrics) -> None:
        self.metrics = metrics
        self.scorer: Scorer | None = None

    def register(self, server: grpc.aio.Server) -> None:
        """Add our handlers (taking raw bytes, see the module doc) to `server`."""
        handlers = {
            "Score": grpc.unary_unary_rpc_method_handler(
                self.Score, response_serializer=reward_pb.ScoreResponse.SerializeToString),
            "ScoreStream": grpc.stream_stream_rpc_method_handler(
                self.ScoreStream,
                response_serializer=reward_pb.ScoreStreamResponse.SerializeToString),
            "ListRewardFunctions": grpc.unary_unary_rpc_method_handler(
                self.ListRewardFunctions,
                response_serializer=reward_pb.ListRewardFunctionsResponse.SerializeToString),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        server.add_registered_method_handlers(SERVICE_NAME, handlers)

    def _ready(self) -> Scorer:
        if self.scorer is None:
            raise Unavailable("reward workers are starting")
        return self.scorer

    async def _score(self, scorer: Scorer, request: reward_pb.ScoreRequest) -> reward_pb.ScoreResponse:
        batch = convert.batch_from_proto(request)
        items, latency = await scorer.score(batch, convert.refs_from_proto(request))
        return convert.response_to_proto(request.request_id, items, latency)

    @grpc_errors
    async def Score(self, request: bytes, context):
        """Score one batch: admitted (or refused) first, then parsed and scored."""
        scorer = self._ready()
        with scorer.admission.admit(context.time_remaining()):
            return await self._score(scorer, _parse(reward_pb.ScoreRequest, request))

    @grpc_errors
    async def ListRewardFunctions(self, request: bytes, context):
        """The functions this server offers."""
        _parse(reward_pb.ListRewardFunctionsRequest, request)
        return reward_pb.ListRewardFunctionsResponse(
            functions=[convert.info_to_proto(info) for info in self._ready().listed])

    async def _stream_one(self, scorer: Scorer, data: bytes) -> reward_pb.ScoreStreamResponse:
        """One stream request, admitted already; its failure becomes a code in its response."""
        request_id = ""
        try:
            request = _parse(reward_pb.ScoreStreamRequest, data).request
            request_id = request.request_id
            response = await self._score(scorer, request)
            code, error = grpc.StatusCode.OK, ""
        except ServiceError as exc:
            response = reward_pb.ScoreResponse(request_id=request_id)
            code, error = exc.code, str(exc)
        except Exception as exc:  # one bad request must not end the stream
            log.exception("ScoreStream request %s failed", shown(request_id))
            response = reward_pb.ScoreResponse(request_id=request_id)
            code, error = grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {shown(str(exc))}"
        self.metrics.record_request("ScoreStream", code.name)
        return reward_pb.ScoreStreamResponse(response=response, code=code.value[0], error=error)

    @grpc_errors
    async def ScoreStream(self, request_iterator, context) -> AsyncIterator[reward_pb.ScoreStreamResponse]:
        """Score requests as they arrive; answer each as soon as it is done.

        The next message is read only once this one holds an admission slot, and at
        most `capacity` answers wait to be sent, so a fast sender (or a slow reader)
        meets HTTP/2 flow control rather than RESOURCE_EXHAUSTED."""
        scorer = self._ready()
        admission = scorer.admission
        unsent = asyncio.Semaphore(admission.capacity)
        done: asyncio.Queue[reward_pb.ScoreStreamResponse | None] = asyncio.Queue()
        pending: set[asyncio.Task] = set()

        async def one(data: bytes) -> None:
            try:
                response = await self._stream_one(scorer, data)
            finally:
                admission.release()
            await done.put(response)

        async def read() -> None:
            try:
                async for data in request_iterator:
                    await unsent.acquire()
                    await admission.wait_for_slot()
                    task = asyncio.create_task(one(data))
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
                unsent.release()
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()
