"""Bearer-token auth and TLS / mTLS on the reward server (certificates made by openssl)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import generate_latest

from agrpo.services.common.config.sections import AuthConfig, TLSConfig
from agrpo.v1 import reward_service_pb2 as pb
from agrpo.v1 import reward_service_pb2_grpc as reward_grpc
from reward_helpers import SERVICE, client, item, make_cfg, request, running, values

pytestmark = pytest.mark.timeout(120)
FUNCS = [{"name": "think_format"}]


async def test_auth_off_by_default_and_enforced_when_set():
    async with running(make_cfg(FUNCS, num_workers=1)) as srv, client(srv.port) as stub:
        resp = await stub.Score(request([item("<think>a</think>")], "think_format_reward"))
        assert values(resp, "think_format_reward") == [1.0]

    cfg = make_cfg(FUNCS, num_workers=1, top={"auth": {"token": "s3cret"}})
    async with running(cfg) as srv:
        async with client(srv.port) as anonymous:
            for call in (anonymous.Score(request([item("a")], "think_format_reward")),
                         anonymous.ListRewardFunctions(pb.ListRewardFunctionsRequest())):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with client(srv.port, auth=AuthConfig(token="wrong")) as wrong:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await wrong.Score(request([item("a")], "think_format_reward"))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with client(srv.port, auth=AuthConfig(token="s3cret")) as good:
            resp = await good.Score(request([item("<think>a</think>")], "think_format_reward"))
            assert values(resp, "think_format_reward") == [1.0]
        # C4: refused calls are counted too (they never reach the servicer).
        text = generate_latest(srv.app.metrics.registry).decode()
        assert 'agrpo_reward_requests_total{code="UNAUTHENTICATED",method="Score"} 2.0' in text
        assert ('agrpo_reward_requests_total{code="UNAUTHENTICATED",method="ListRewardFunctions"}'
                ' 1.0') in text
        # Probes carry no token: health stays open.
        async with grpc.aio.insecure_channel(f"localhost:{srv.port}") as channel:
            resp = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_empty_token_file_fails_closed(tmp_path: Path):
    # C5: an empty auth.token_file silently turned auth off.
    for auth in ({"token_file": str(tmp_path / "token")}, {"token": ""}):
        (tmp_path / "token").write_text("  \n")
        with pytest.raises(ValueError, match="empty"):
            async with running(make_cfg(FUNCS, num_workers=1, top={"auth": auth})):
                pass


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_start_up_log_says_whether_tls_and_auth_are_on(pki: Path, tmp_path: Path):
    # C5: the start-up log never said.
    (tmp_path / "token").write_text("s3cret\n")
    server_tls = {"enabled": True, "cert_file": str(pki / "server.pem"),
                  "key_file": str(pki / "server.key"), "ca_file": str(pki / "ca.pem"),
                  "require_client_auth": True}
    seen = _Records()
    logger = logging.getLogger("agrpo.server")
    level = logger.level
    logger.addHandler(seen)
    logger.setLevel(logging.INFO)
    try:
        async with running(make_cfg(FUNCS, num_workers=1)):
            pass
        top = {"tls": server_tls, "auth": {"token_file": str(tmp_path / "token")}}
        async with running(make_cfg(FUNCS, num_workers=1, top=top)):
            pass
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
    listening = [(r.tls, r.auth) for r in seen.records if r.getMessage().startswith("gRPC listening")]
    assert listening == [("off", "off"), ("mtls", "token")]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, a server certificate for localhost and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", f"{name}.pem", cwd=d)
    return d


async def _refused(channel: grpc.aio.Channel) -> bool:
    """True when a Score call on `channel` (no retries) cannot get through."""
    async with channel:
        stub = reward_grpc.RewardServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Score(request([item("a")], "think_format_reward"), timeout=10)
    return info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_tls_and_mtls(pki: Path):
    server_tls = {"enabled": True, "cert_file": str(pki / "server.pem"),
                  "key_file": str(pki / "server.key"), "ca_file": str(pki / "ca.pem")}
    client_tls = TLSConfig(enabled=True, cert_file=pki / "client.pem", key_file=pki / "client.key",
                           ca_file=pki / "ca.pem")
    async with running(make_cfg(FUNCS, num_workers=1, top={"tls": server_tls})) as srv:
        async with client(srv.port, tls=client_tls) as stub:
            resp = await stub.Score(request([item("<think>a</think>")], "think_format_reward"))
            assert values(resp, "think_format_reward") == [1.0]
        assert await _refused(grpc.aio.insecure_channel(f"localhost:{srv.port}"))

    mtls = {**server_tls, "require_client_auth": True}
    async with running(make_cfg(FUNCS, num_workers=1, top={"tls": mtls})) as srv:
        mutual = client_tls.model_copy(update={"require_client_auth": True})
        async with client(srv.port, tls=mutual) as stub:
            resp = await stub.Score(request([item("<think>a</think>")], "think_format_reward"))
            assert values(resp, "think_format_reward") == [1.0]
        no_cert = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
        assert await _refused(grpc.aio.secure_channel(f"localhost:{srv.port}", no_cert))
        # The way in for probes under mTLS (Kubernetes' grpc: probes are plaintext only).
        certs = ["--ca", str(pki / "ca.pem"), "--cert", str(pki / "client.pem"),
                 "--key", str(pki / "client.key")]
        assert await asyncio.to_thread(_probe, srv.port, certs) == 0
        assert await asyncio.to_thread(_probe, srv.port, []) == 1  # plaintext is refused


def _probe(port: int, args: list[str]) -> int:
    probe = Path(__file__).resolve().parents[3] / "deploy" / "docker" / "grpc_health_probe.py"
    return subprocess.run([sys.executable, str(probe), f"localhost:{port}", "--service", SERVICE,
                           "--timeout", "10", *args], capture_output=True, check=False).returncode
