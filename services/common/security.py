"""TLS credentials and bearer-token auth, shared by servers and clients."""

from __future__ import annotations

import hmac

import grpc

from .config.sections import AuthConfig, TLSConfig

# Health checks must work without a token: Kubernetes probes send none.
_OPEN_METHODS = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def server_credentials(tls: TLSConfig) -> grpc.ServerCredentials | None:
    """Server TLS (mTLS when require_client_auth), or None for plaintext."""
    if not tls.enabled:
        return None
    # TLSConfig's validator demands cert_file and key_file when enabled.
    assert tls.key_file is not None and tls.cert_file is not None
    pair = [(tls.key_file.read_bytes(), tls.cert_file.read_bytes())]
    ca = tls.ca_file.read_bytes() if tls.ca_file else None
    return grpc.ssl_server_credentials(pair, root_certificates=ca,
                                       require_client_auth=tls.require_client_auth)


def channel_credentials(tls: TLSConfig) -> grpc.ChannelCredentials | None:
    """Client TLS (presenting our certificate for mTLS), or None for plaintext."""
    if not tls.enabled:
        return None
    ca = tls.ca_file.read_bytes() if tls.ca_file else None
    key = tls.key_file.read_bytes() if tls.require_client_auth and tls.key_file else None
    cert = tls.cert_file.read_bytes() if tls.require_client_auth and tls.cert_file else None
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without `authorization: Bearer <token>` with UNAUTHENTICATED."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        async def deny(request, context):  # same shape for unary and streams: abort first
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

        self._deny_unary = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_stream_rpc_method_handler(deny)
        self._deny_unary_stream = grpc.unary_stream_rpc_method_handler(deny)
        self._deny_stream_unary = grpc.stream_unary_rpc_method_handler(deny)

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(_OPEN_METHODS):
            return await continuation(handler_call_details)
        got = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(got.encode() if isinstance(got, str) else got, self._expected):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.request_streaming and handler.response_streaming:
            return self._deny_stream
        if handler.request_streaming:
            return self._deny_stream_unary
        if handler.response_streaming:
            return self._deny_unary_stream
        return self._deny_unary


def server_token(auth: AuthConfig) -> str | None:
    """The token a server enforces, None when auth is off. A token that is configured
    but empty (an empty token_file, `token: ""`) is a ValueError: it must not turn auth off."""
    token = auth.resolve()
    if not token and (auth.token is not None or auth.token_file is not None):
        source = f"auth.token_file {str(auth.token_file)!r}" if auth.token_file else "auth.token"
        raise ValueError(f"{source} is empty; refusing to start without auth (unset it to turn "
                         "auth off)")
    return token or None


def token_metadata(auth: AuthConfig) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying our bearer token (empty when auth is off)."""
    token = auth.resolve()
    return (("authorization", f"Bearer {token}"),) if token else ()
