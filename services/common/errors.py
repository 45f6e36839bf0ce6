"""Domain errors and their one mapping to gRPC status codes.

Servicers raise these; `grpc_errors` turns them into `context.abort(code, message)`.
Anything else is logged with its traceback and becomes INTERNAL.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any

import grpc

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


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException, method: str) -> None:
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
