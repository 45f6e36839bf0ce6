"""Count every RewardService call by its final status code, whatever ended it.

An interceptor rather than the handlers, because some outcomes never reach them or
end them from outside: a call refused by the bearer-token check (UNAUTHENTICATED), a
call the client cancelled (CANCELLED), a call whose deadline passed (DEADLINE_EXCEEDED).
The handler's task is cancelled in the last two cases, so the code is read from how it
ended: cancelled with no time left is DEADLINE_EXCEEDED, cancelled otherwise CANCELLED.

ScoreStream counts each request on the stream in the servicer (with the code in its
response); here a stream is counted only when it ends in an error of its own.
It must be the first interceptor, outside the token check, to see its refusals.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import grpc

DEADLINE_SLACK_S = 0.01
"""A call cancelled with at most this much time left counts as past its deadline (the
client's timer may fire a little before ours)."""


def _cancel_code(context: grpc.aio.ServicerContext) -> str:
    left = context.time_remaining()
    return "DEADLINE_EXCEEDED" if left is not None and left <= DEADLINE_SLACK_S else "CANCELLED"


class CallCounter(grpc.aio.ServerInterceptor):
    """Calls `record(method, code)` once per call of `service` (streams: errors only)."""

    def __init__(self, service: str, record: Callable[[str, str], None]) -> None:
        self._prefix = f"/{service}/"
        self._record = record

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(self._prefix):
            return handler
        name = method.removeprefix(self._prefix)
        if not handler.request_streaming and not handler.response_streaming:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(name, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(name, handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return handler

    @contextlib.contextmanager
    def _counting_errors(self, name: str, context):
        """Record a call that ends in an exception by the code it ends with."""
        try:
            yield
        except asyncio.CancelledError:
            self._record(name, _cancel_code(context))
            raise
        except grpc.aio.AbortError:
            self._record(name, _code(context, "UNKNOWN"))
            raise
        except Exception:
            self._record(name, "UNKNOWN")
            raise

    def _unary(self, name: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def counted(request, context):
            with self._counting_errors(name, context):
                response = await behavior(request, context)
            self._record(name, _code(context, "OK"))
            return response
        return counted

    def _stream(self, name: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def counted(request_iterator, context):
            with self._counting_errors(name, context):
                result = behavior(request_iterator, context)
                if inspect.isasyncgen(result):
                    async for response in result:
                        yield response
                else:  # a coroutine, like the token check's refusal
                    await result
            code = _code(context, "OK")
            if code != "OK":
                self._record(name, code)
        return counted


def _code(context: grpc.aio.ServicerContext, default: str) -> str:
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else default
