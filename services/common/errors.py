"""Domain errors and their one mapping to gRPC status codes.

Servicers raise these; `grpc_errors` turns them into `context.abort(code, message)`.
Bytes that do not parse as the request message are INVALID_ARGUMENT: a streamed request
raises protobuf's DecodeError where the servicer reads it (mapped here), and a unary one
is parsed before any servicer runs, so `DecodeErrors` (an interceptor every GrpcServer
installs) answers it instead of gRPC's UNKNOWN. Anything else is logged with its
traceback and becomes INTERNAL.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from .logging import get_logger

log = get_logger("errors")


class ServiceError(Exception):
    """Base of errors that cross the service boundary with a meaningful status."""

    code = grpc.StatusCode.INTERNAL


class InvalidArgument(ServiceError):
    """Malformed request: retrying the same request will not help."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    """An unknown name (reward function, environment, ...)."""

    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(ServiceError):
    """Queue full or request too large: back off."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ServiceError):
    """Shutting down or a peer is restarting: retry."""

    code = grpc.StatusCode.UNAVAILABLE


def undecodable(exc: DecodeError) -> InvalidArgument:
    """The error for bytes that are not the request message (protobuf's text is bounded)."""
    return InvalidArgument(f"request does not parse: {str(exc)[:300] or 'wire format error'}")


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException, method: str) -> None:
    if isinstance(exc, DecodeError):
        exc = undecodable(exc)
    if isinstance(exc, ServiceError):
        await context.abort(exc.code, str(exc))
    log.exception("unhandled error in %s", method, exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


def grpc_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """Map domain errors to status codes, for unary and streaming async handlers."""
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def stream_wrapper(self, request, context):
            try:
                async for item in method(self, request, context):
                    yield item
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as exc:  # noqa: BLE001 - the boundary maps everything
                await _abort(context, exc, method.__qualname__)
        return stream_wrapper

    @functools.wraps(method)
    async def unary_wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001 - the boundary maps everything
            await _abort(context, exc, method.__qualname__)
    return unary_wrapper


class _Undecodable:
    """Stands in for a unary request whose bytes did not parse, until the handler refuses it."""

    def __init__(self, error: DecodeError) -> None:
        self.error = error


class DecodeErrors(grpc.aio.ServerInterceptor):
    """Unary requests that do not parse get INVALID_ARGUMENT (gRPC alone answers UNKNOWN and
    logs a traceback). Streamed requests are left alone: they fail where the servicer reads them."""

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary
        if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
            return handler
        parse = handler.request_deserializer

        def deserializer(data: bytes):
            try:
                return parse(data)
            except DecodeError as exc:
                return _Undecodable(exc)

        async def refuse(request, context) -> None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(undecodable(request.error)))

        if handler.response_streaming:
            async def unary_stream(request, context):
                if isinstance(request, _Undecodable):
                    await refuse(request, context)
                async for item in behavior(request, context):
                    yield item
            return handler._replace(request_deserializer=deserializer, unary_stream=unary_stream)

        async def unary_unary(request, context):
            if isinstance(request, _Undecodable):
                await refuse(request, context)
            return await behavior(request, context)
        return handler._replace(request_deserializer=deserializer, unary_unary=unary_unary)
