"""The shared server bootstrap over a real socket: health transitions, reflection,
auth, deadlines and graceful stop (in-process and on SIGTERM)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agrpo.services.common.channels import open_channel
from agrpo.services.common.config.sections import AuthConfig, RolloutSection
from agrpo.services.common.identity import Identity
from agrpo.services.common.server import GrpcServer
from agrpo.v1 import common_pb2, rollout_service_pb2_grpc

SERVICE = "agrpo.v1.RolloutService"


class _SlowRollout(rollout_service_pb2_grpc.RolloutServiceServicer):
    """A minimal servicer: Heartbeat answers after a delay the test controls."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.identity = Identity("rollout")

    async def Heartbeat(self, request, context):
        await asyncio.sleep(self.delay_s)
        return common_pb2.HeartbeatResponse(receiver=self.identity.info())


def _server(delay_s: float = 0.0, token: str | None = None, grace_s: float = 5.0) -> GrpcServer:
    servicer = _SlowRollout(delay_s)
    return GrpcServer(RolloutSection(port=0, grace_s=grace_s), [SERVICE],
                      lambda s: rollout_service_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, s),
                      auth=AuthConfig(token=token))


async def _health(channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return resp.status


async def test_health_starts_not_serving_then_serving():
    server = _server()
    port = await server.start()
    assert port > 0
    async with grpc.aio.insecure_channel(f"localhost:{port}") as ch:
        assert await _health(ch) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await _health(ch, SERVICE) == health_pb2.HealthCheckResponse.NOT_SERVING
        await server.set_serving(True)
        assert await _health(ch, SERVICE) == health_pb2.HealthCheckResponse.SERVING
        await server.stop(0)


async def test_reflection_lists_the_service():
    server = _server()
    port = await server.start()
    async with grpc.aio.insecure_channel(f"localhost:{port}") as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = [s.name async for r in responses for s in r.list_services_response.service]
    await server.stop(0)
    assert SERVICE in names and "grpc.health.v1.Health" in names


async def test_graceful_stop_lets_inflight_call_finish():
    server = _server(delay_s=0.5, grace_s=5)
    port = await server.start()
    async with open_channel(f"localhost:{port}", [SERVICE]) as ch:
        stub = rollout_service_pb2_grpc.RolloutServiceStub(ch)
        call = asyncio.ensure_future(stub.Heartbeat(common_pb2.HeartbeatRequest()))
        await asyncio.sleep(0.1)
        await server.stop()
        resp = await call
    assert resp.receiver.service == "rollout"


async def test_default_deadline_applies_to_unary_calls():
    server = _server(delay_s=3)
    port = await server.start()
    async with open_channel(f"localhost:{port}", [SERVICE], deadline_s=0.3) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rollout_service_pb2_grpc.RolloutServiceStub(ch).Heartbeat(common_pb2.HeartbeatRequest())
    await server.stop(0)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_bearer_token_auth():
    server = _server(token="s3cret")
    port = await server.start()
    addr = f"localhost:{port}"
    request = common_pb2.HeartbeatRequest()
    async with open_channel(addr, [SERVICE]) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rollout_service_pb2_grpc.RolloutServiceStub(ch).Heartbeat(request)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Health stays open for probes that carry no token.
        assert await _health(ch) == health_pb2.HealthCheckResponse.NOT_SERVING
    async with open_channel(addr, [SERVICE], auth=AuthConfig(token="wrong")) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rollout_service_pb2_grpc.RolloutServiceStub(ch).Heartbeat(request)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with open_channel(addr, [SERVICE], auth=AuthConfig(token="s3cret")) as ch:
        resp = await rollout_service_pb2_grpc.RolloutServiceStub(ch).Heartbeat(request)
        assert resp.receiver.service == "rollout"
    await server.stop(0)


def test_sigterm_stops_a_server_process_gracefully(tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(textwrap.dedent("""
        import asyncio
        from test_server_bootstrap import _server
        async def main():
            server = _server()
            port = await server.start()
            await server.set_serving(True)
            print(port, flush=True)
            await server.wait_for_stop()
            print("stopped", flush=True)
        asyncio.run(main())
    """))
    path = [os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = int(proc.stdout.readline())
        with grpc.insecure_channel(f"localhost:{port}") as ch:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "stopped" in out
