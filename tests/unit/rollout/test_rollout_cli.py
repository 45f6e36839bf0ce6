"""`agrpo rollout` fails fast with one clear line (exit 2) when a peer or the data is missing."""

import os
import subprocess
import sys


def _run(*flags):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "agrpo.services.rollout", "--rollout.port", "0",
                           "--rollout.metrics_port", "null", "--log_format", "text", *flags],
                          capture_output=True, text=True, timeout=120, env=env, check=False)


def test_unreachable_vllm_exits_2_naming_the_timeout():
    r = _run("--dataset.path", "json", "--vllm_server_base_url", "http://127.0.0.1:9",
             "--vllm_server_timeout", "1")
    assert r.returncode == 2  # a configuration error: a supervisor does not restart it
    assert "not healthy after 1 s (vllm_server_timeout)" in r.stderr and "Traceback" not in r.stderr


def test_missing_dataset_exits_2():
    r = _run("--vllm_server_base_url", "http://127.0.0.1:9")
    assert r.returncode == 2 and "dataset.path is not set" in r.stderr
