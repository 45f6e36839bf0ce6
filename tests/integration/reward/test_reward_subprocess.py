"""`agrpo reward` as a real subprocess: flags, health, scoring, /metrics, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from agrpo.launcher.probe import wait_serving
from agrpo.services.common.ports import free_port
from agrpo.v1 import reward_service_pb2 as pb
from reward_helpers import HERE, OK, SERVICE, client, column, item

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[3]
AGRPO = REPO / ".venv" / "bin" / "agrpo"


def _wait_serving(port: int, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
    def check_alive() -> None:
        if proc.poll() is not None:
            raise AssertionError(f"agrpo reward exited with {proc.returncode}: "
                                 f"{proc.stderr.read().decode()[-2000:]}")

    assert wait_serving(f"localhost:{port}", SERVICE, timeout_s, check_alive), \
        "agrpo reward did not become SERVING"


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


async def test_agrpo_reward_subprocess():
    port, metrics_port = free_port(), free_port()
    funcs = json.dumps([{"name": "accuracy"}, {"name": "reward_user_funcs:async_len", "weight": 0.5}])
    proc = subprocess.Popen(
        [str(AGRPO), "reward", "--reward.port", str(port), "--reward.metrics_port", str(metrics_port),
         "--reward.num_workers", "1", "--reward_funcs", funcs, "--log_format", "json"],
        cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_serving(port, proc)
        async with client(port) as stub:
            resp = await stub.Score(pb.ScoreRequest(request_id="x", items=[
                item(r"\boxed{\frac{1}{3}}", solution=r"\frac{1}{3}")]))
            assert column(resp, "accuracy_reward") == [(OK, 1.0)]
            assert resp.items[0].total == 1.0 + 0.5 * len(r"\boxed{\frac{1}{3}}")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'agrpo_reward_requests_total{code="OK",method="Score"} 1.0' in text
        assert 'agrpo_reward_function_latency_seconds_count{function="accuracy_reward"} 1.0' in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_agrpo_reward_bad_function_exits_nonzero():
    proc = subprocess.run(
        [str(AGRPO), "reward", "--reward.port", "0", "--reward.metrics_port", "null",
         "--reward_funcs", '[{name: "nope_module_q:fn"}]'],
        cwd=REPO, env=_env(), capture_output=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert b"nope_module_q" in proc.stderr


async def test_sigkilled_server_leaves_no_worker_behind(tmp_path):
    port = free_port()
    pid_file = tmp_path / "pid"
    proc = subprocess.Popen(
        [str(AGRPO), "reward", "--reward.port", str(port), "--reward.metrics_port", "null",
         "--reward.num_workers", "1", "--reward_funcs", '[{name: "reward_user_funcs:pid_then_sleep"}]'],
        cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_serving(port, proc)
        async with client(port) as stub:
            call = asyncio.ensure_future(stub.Score(pb.ScoreRequest(items=[
                item("a", pid_file=str(pid_file))]), timeout=60))
            for _ in range(400):
                if pid_file.exists() and pid_file.read_text():
                    break
                await asyncio.sleep(0.05)
            worker_pid = int(pid_file.read_text())
            proc.kill()  # SIGKILL: no cleanup code runs in the server
            proc.wait(timeout=30)
            with pytest.raises(grpc.aio.AioRpcError):
                await call
        for _ in range(200):  # the hung worker must go too (parent-death signal)
            if not _alive(worker_pid):
                break
            time.sleep(0.05)
        assert not _alive(worker_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
