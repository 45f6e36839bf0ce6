"""Client channels: a deadline on every unary call, UNAVAILABLE-only retries, keepalive,
size limits, TLS and the bearer token added to every call."""

from __future__ import annotations

import json

import grpc

from .config.sections import AuthConfig, TLSConfig
from .security import channel_credentials, token_metadata


def _service_config(service_names: list[str]) -> str:
    """Retry policy: only UNAVAILABLE is retried, with exponential backoff (gRPC A6)."""
    return json.dumps({
        "methodConfig": [{
            "name": [{"service": name} for name in service_names],
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.2s",
                "maxBackoff": "5s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }],
    })


class _CallDefaults(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor,
                    grpc.aio.StreamUnaryClientInterceptor, grpc.aio.StreamStreamClientInterceptor):
    """Adds auth metadata to every call and a default deadline to unary calls without one."""

    def __init__(self, metadata: tuple[tuple[str, str], ...], default_timeout_s: float) -> None:
        self._metadata = metadata
        self._timeout = default_timeout_s

    def _details(self, details: grpc.aio.ClientCallDetails, unary: bool) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        timeout = details.timeout if details.timeout is not None or not unary else self._timeout
        return grpc.aio.ClientCallDetails(details.method, timeout, metadata, details.credentials,
                                          details.wait_for_ready)

    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details, True), request)

    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details, False), request)

    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._details(details, True), request_iterator)

    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._details(details, False), request_iterator)


def open_channel(address: str, service_names: list[str], *, deadline_s: float = 30.0,
                 max_message_mb: int = 64, tls: TLSConfig | None = None,
                 auth: AuthConfig | None = None) -> grpc.aio.Channel:
    """An aio channel to `address`. Unary calls without a timeout get `deadline_s`;
    streaming calls are long-lived and get none unless the caller sets one."""
    limit = max_message_mb * 1024 * 1024
    options = [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", _service_config(service_names)),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    interceptors = [_CallDefaults(token_metadata(auth) if auth else (), deadline_s)]
    creds = channel_credentials(tls) if tls else None
    if tls is None or creds is None:  # creds are None without tls
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    if tls.server_name_override:
        options.append(("grpc.ssl_target_name_override", tls.server_name_override))
    return grpc.aio.secure_channel(address, creds, options=options, interceptors=interceptors)
