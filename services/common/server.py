"""The async gRPC server bootstrap shared by every service.

Health (NOT_SERVING until the service says it is ready), reflection, explicit
message-size limits, optional TLS and bearer-token auth, graceful stop on SIGTERM.
Port 0 binds a free port; `GrpcServer.port` reports it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from .config.sections import AuthConfig, ServiceSection, TLSConfig
from .errors import DecodeErrors
from .logging import get_logger
from .preflight import INTERRUPTED_EXIT
from .security import BearerTokenInterceptor, server_credentials, server_token

log = get_logger("server")
Registrar = Callable[[grpc.aio.Server], None]


class GrpcServer:
    """A started-on-demand grpc.aio server with health and reflection for its services."""

    def __init__(self, section: ServiceSection, service_names: Iterable[str], register: Registrar,
                 tls: TLSConfig | None = None, auth: AuthConfig | None = None,
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> None:
        """`interceptors` run first, outside the bearer-token check (they see its refusals);
        innermost, unary requests that do not parse get INVALID_ARGUMENT (errors.DecodeErrors)."""
        self.section = section
        self.service_names = list(service_names)
        limit = section.max_message_mb * 1024 * 1024
        token = server_token(auth) if auth else None
        chain = [*interceptors, *([BearerTokenInterceptor(token)] if token else []), DecodeErrors()]
        self.security = {"tls": _tls_mode(tls), "auth": "token" if token else "off"}
        self.server = grpc.aio.server(
            interceptors=chain,
            options=[("grpc.max_send_message_length", limit),
                     ("grpc.max_receive_message_length", limit),
                     ("grpc.so_reuseport", 0),
                     # Accept the clients' keepalive pings (channels.py) without GOAWAY.
                     ("grpc.keepalive_permit_without_calls", 1),
                     ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
                     ("grpc.http2.max_ping_strikes", 0)])
        register(self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        creds = server_credentials(tls) if tls else None
        target = f"{section.host}:{section.port}"
        self.port = (self.server.add_secure_port(target, creds) if creds
                     else self.server.add_insecure_port(target))
        if self.port == 0:
            raise RuntimeError(f"could not bind {target}")
        self._stopped = asyncio.Event()

    async def start(self) -> int:
        """Start serving (health NOT_SERVING); return the bound port."""
        await self.set_serving(False)
        await self.server.start()
        log.info("gRPC listening on %s:%d (TLS %s, auth %s)", self.section.host, self.port,
                 self.security["tls"], self.security["auth"],
                 extra={"services": self.service_names, **self.security})
        return self.port

    async def set_serving(self, serving: bool) -> None:
        """Flip the health status of the overall server and of every service."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def stop(self, grace_s: float | None = None) -> None:
        """NOT_SERVING first so balancers drain us, then stop within the grace period."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.section.grace_s if grace_s is None else grace_s)
        log.info("gRPC server stopped")

    async def wait_for_stop(self, signals: StopSignals | None = None) -> None:
        """Block until a stop signal (then stop gracefully) or until stop() is called."""
        signals = signals or StopSignals().install()
        stopped = asyncio.ensure_future(self._stopped.wait())
        requested = asyncio.ensure_future(signals.requested.wait())
        await asyncio.wait([stopped, requested], return_when=asyncio.FIRST_COMPLETED)
        requested.cancel()
        await self.stop()
        await self.server.wait_for_termination()


class StopSignals:
    """SIGTERM / SIGINT: the first asks for a clean stop (`requested`), a second exits at once.

    Installed at the very start of a service, so a stop also works while it still waits for
    a peer (vLLM, the trainer) or loads a model.
    """

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.count = 0

    def install(self) -> StopSignals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass
        return self

    def _on_signal(self, sig: signal.Signals) -> None:
        self.count += 1
        if self.count > 1:
            log.warning("received %s again: exiting now", sig.name)
            os._exit(INTERRUPTED_EXIT)
        log.info("received %s: stopping (send it again to exit at once)", sig.name)
        self.requested.set()


def _tls_mode(tls: TLSConfig | None) -> str:
    if tls is None or not tls.enabled:
        return "off"
    return "mtls" if tls.require_client_auth else "on"
