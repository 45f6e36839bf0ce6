"""Calls that end badly are counted by their final code; a worker that died idle costs nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest

from reward_helpers import OK, client, column, item, make_cfg, request, running

pytestmark = pytest.mark.timeout(120)
U = "reward_user_funcs"


def requests_total(srv, method: str, code: str) -> float:
    prefix = f'agrpo_reward_requests_total{{code="{code}",method="{method}"}} '
    for line in generate_latest(srv.app.metrics.registry).decode().splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_cancelled_and_deadline_exceeded_calls_are_counted_as_such():
    # C4: both were counted as code="OK".
    cfg = make_cfg([{"name": f"{U}:nap"}], num_workers=1)
    async with running(cfg) as srv, client(srv.port) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Score(request([item("a")], "nap"), timeout=0.5)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        call = stub.Score(request([item("b")], "nap"))
        await asyncio.sleep(0.3)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await stub.Score(request([item("c")], "nap"))
        for _ in range(50):  # the server sees the cancellation a moment later
            if requests_total(srv, "Score", "CANCELLED"):
                break
            await asyncio.sleep(0.1)
        assert requests_total(srv, "Score", "DEADLINE_EXCEEDED") == 1
        assert requests_total(srv, "Score", "CANCELLED") == 1
        assert requests_total(srv, "Score", "OK") == 1


def _non_loopback_ip() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


async def test_metrics_listen_on_the_service_host_only():
    # C4: /metrics listened on 0.0.0.0 even with reward.host 127.0.0.1.
    cfg = make_cfg([{"name": "think_format"}], num_workers=1, metrics_port=0, host="127.0.0.1")
    async with running(cfg) as srv:
        url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        assert b"agrpo_reward_requests_total" in text
        ip = _non_loopback_ip()
        if ip is None:
            pytest.skip("no non-loopback address to check the binding from")
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://{ip}:{srv.metrics_port}/metrics", timeout=5))


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError):
        return True


async def test_idle_worker_that_died_is_replaced_before_the_next_call():
    # C6: the next call routed to it came back FAILED ("died during the call").
    cfg = make_cfg([{"name": f"{U}:worker_pid"}], num_workers=1)
    async with running(cfg) as srv, client(srv.port) as stub:
        ((status, pid),) = column(await stub.Score(request([item("a")], "worker_pid")), "worker_pid")
        assert status == OK
        os.kill(int(pid), signal.SIGKILL)
        for _ in range(100):
            if _gone(int(pid)):
                break
            await asyncio.sleep(0.05)
        ((status, new_pid),) = column(await stub.Score(request([item("b")], "worker_pid")),
                                      "worker_pid")
        assert status == OK and new_pid != pid


async def test_workers_score_at_a_lower_cpu_priority_than_the_front():
    # C8: under overload the front must keep the CPU to refuse at once (refusals took 2 s at p50).
    from agrpo.services.reward.worker import WORKER_NICENESS

    cfg = make_cfg([{"name": f"{U}:worker_pid"}], num_workers=1)
    async with running(cfg) as srv, client(srv.port) as stub:
        ((status, pid),) = column(await stub.Score(request([item("a")], "worker_pid")), "worker_pid")
        assert status == OK
        front = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, int(pid)) == min(front + WORKER_NICENESS, 19)
