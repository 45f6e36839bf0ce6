"""A TRL user's own job through `agrpo run` and the Python API, as separate real processes.

The job is the user's: its own JSONL and its own reward module in a folder outside the
repository; vLLM is the session's real server (agrpo run uses it because it answers). Also:
Ctrl-C in the middle, a reward that raises, and one line for each start-up mistake.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from trainer_helpers import restore_server
from vllm_server import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(900)]

AGRPO = [sys.executable, "-m", "agrpo.cli"]
REWARDS = '''
def length_reward(completions, **kwargs):
    """Longer answers score higher (a user's own reward, called as TRL calls it)."""
    return [min(len(c[0]["content"] if isinstance(c, list) else c), 30) / 30 for c in completions]


def always_fails(completions, **kwargs):
    raise ZeroDivisionError("my reward is broken")
'''


@pytest.fixture
def shared(vllm_server, tiny_model_dir):
    yield vllm_server
    restore_server(vllm_server, tiny_model_dir)


def user_job(root: Path, server, model_dir, **over) -> Path:
    """A user's folder: prompts.jsonl, my_rewards.py and job.yaml; returns the config."""
    user = root / "user"
    user.mkdir(exist_ok=True)
    (user / "my_rewards.py").write_text(REWARDS)
    with open(user / "prompts.jsonl", "w") as f:
        for i in range(16):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"Count to {i}."}], "n": i}) + "\n")
    cfg = {"model": str(model_dir), "vllm_server_base_url": server.base_url,
           "dataset": {"path": "json", "data_files": "prompts.jsonl"}, "reward_funcs": ["my_rewards:length_reward"],
           "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 12,
           "max_steps": 3, "learning_rate": 1e-3, "output_dir": str(root / "out"), "logging_steps": 1,
           "gradient_checkpointing": False, "log_format": "text", "disable_tqdm": True,
           "trainer": {"port": free_port(), "metrics_port": None, "idle_flush_s": 1.0},
           "rollout": {"port": free_port(), "metrics_port": None},
           "reward": {"port": free_port(), "metrics_port": None, "num_workers": 1}}
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    path = user / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def _steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def test_agrpo_run_trains_a_users_job_and_exits_0(shared, tiny_model_dir, tmp_path):
    job = user_job(tmp_path, shared, tiny_model_dir)
    r = subprocess.run([*AGRPO, "run", str(job)], cwd=job.parent, env=_env(), capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert _steps(tmp_path / "out") == [1, 2, 3]
    trained = (tmp_path / "out" / "trained_samples.jsonl").read_text().splitlines()
    assert len(trained) >= 3 * 8 and "training done" in r.stdout


def test_ctrl_c_stops_after_the_step_in_progress(shared, tiny_model_dir, tmp_path):
    job = user_job(tmp_path, shared, tiny_model_dir, max_steps=500, save_strategy="steps", save_steps=1000)
    proc = subprocess.Popen([*AGRPO, "run", str(job)], cwd=job.parent, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while len(_steps(tmp_path / "out")) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, out[-3000:]
    # Steps of the tiny model take a fraction of a second: count from the step the trainer says
    # the stop reached it after, not from the step this test last saw.
    said = re.findall(r"stop requested after step (\d+)", (tmp_path / "out" / "logs" / "trainer.log").read_text())
    assert said, out[-3000:]
    k = int(said[0])
    steps = _steps(tmp_path / "out")
    assert steps and k >= 2 and max(steps) <= k + 1, (k, steps)
    audit = [json.loads(x)["step"] for x in (tmp_path / "out" / "trained_samples.jsonl").read_text().splitlines()]
    assert max(audit) == max(steps)
    # save_strategy asks for checkpoints: the stop wrote one at the last step trained.
    assert (tmp_path / "out" / f"checkpoint-{max(steps)}").is_dir()
    # The last line says what was kept and how to continue (a plain restart starts a new run).
    assert out.rstrip().splitlines()[-1] == (f"[run] stopped; kept {tmp_path / 'out' / f'checkpoint-{max(steps)}'}. "
                                             f"To continue it: agrpo run {job} --resume_from_checkpoint true"), out[-600:]


def test_two_trainer_ranks_stop_together_on_ctrl_c(shared, tiny_model_dir, tmp_path):
    """trainer.num_processes 2: agrpo run starts the trainer under torchrun (gloo on CPU);
    Ctrl-C stops both ranks after the step, with a sharded checkpoint."""
    job = user_job(tmp_path, shared, tiny_model_dir, max_steps=500, save_strategy="steps", save_steps=1000,
                   trainer={"num_processes": 2, "collective_timeout_s": 60})
    proc = subprocess.Popen([*AGRPO, "run", str(job)], cwd=job.parent, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 400
        while len(_steps(tmp_path / "out")) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, out[-3000:]
    log = (tmp_path / "out" / "logs" / "trainer.log").read_text()
    assert "rank 1 of 2 joined" in log and "rank 1: stop" in log, log[-3000:]
    last = max(_steps(tmp_path / "out"))
    assert any((tmp_path / "out" / f"checkpoint-{last}" / "shards").iterdir())


def test_a_raising_reward_stops_the_run_naming_it(shared, tiny_model_dir, tmp_path):
    job = user_job(tmp_path, shared, tiny_model_dir, max_steps=50, reward_funcs=["my_rewards:always_fails"])
    r = subprocess.run([*AGRPO, "run", str(job)], cwd=job.parent, env=_env(), capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "always_fails" in last and "ZeroDivisionError" in last and "Traceback" not in r.stderr
    assert len(_steps(tmp_path / "out")) <= 3  # trainer.reward_failure_patience


def test_python_api_runs_trls_quick_start(shared, tiny_model_dir, tmp_path):
    script = tmp_path / "train_async_grpo.py"
    script.write_text(textwrap.dedent(f"""
        from datasets import Dataset
        from agrpo import AsyncGRPOConfig, AsyncGRPOTrainer


        def digit_reward(completions, **kwargs):
            return [sum(ch.isdigit() for ch in c[0]["content"]) / 10 for c in completions]


        if __name__ == "__main__":
            dataset = Dataset.from_list([{{"prompt": [{{"role": "user", "content": f"What is {{i}} + 1?"}}]}}
                                         for i in range(16)])
            trainer = AsyncGRPOTrainer(
                model={str(tiny_model_dir)!r},
                reward_funcs=digit_reward,
                train_dataset=dataset,
                args=AsyncGRPOConfig(output_dir={str(tmp_path / "out")!r}, max_steps=2, num_generations=4,
                                     per_device_train_batch_size=8, max_completion_length=12,
                                     vllm_server_base_url={shared.base_url!r}, disable_tqdm=True,
                                     trainer={{"port": {free_port()}, "metrics_port": None}},
                                     rollout={{"port": {free_port()}, "metrics_port": None}},
                                     reward={{"port": {free_port()}, "metrics_port": None, "num_workers": 1}}),
            )
            trainer.train()
            print("TRAINED")
    """))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 0 and "TRAINED" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    assert _steps(tmp_path / "out") == [1, 2]
    assert (tmp_path / "out" / "api" / "train.jsonl").exists()


def test_the_api_refuses_a_lambda_as_trl_does(tmp_path):
    from agrpo import AsyncGRPOConfig, AsyncGRPOTrainer

    trainer = AsyncGRPOTrainer(model=str(tmp_path), reward_funcs=lambda completions, **kw: [0.0],
                               args=AsyncGRPOConfig(output_dir=str(tmp_path / "out")), train_dataset="x.jsonl")
    with pytest.raises(TypeError, match="lambda or a closure"):
        trainer.config()


MISTAKES = [
    ("port in use", lambda held: {"trainer": {"port": held}}, "trainer.port"),
    ("metrics port in use", lambda held: {"reward": {"metrics_port": held}}, "reward.metrics_port"),
    ("model missing", lambda held: {"model": "./no-such-model"}, "model"),
    ("data file missing", lambda held: {"dataset": {"path": "json", "data_files": "nope.jsonl"}}, "dataset.data_files"),
    ("vLLM URL with /v1", lambda held: {"vllm_server_base_url": "http://localhost:8000/v1"}, "vllm_server_base_url"),
    ("vLLM unreachable", lambda held: {"vllm_server_base_url": "http://10.255.255.1:8000"}, "vllm_server_base_url"),
    ("unknown built-in reward", lambda held: {"reward_funcs": ["acuracy"]}, "reward_funcs[0]"),
    ("unknown config key", lambda held: {"max_stalness": 2}, "max_staleness"),
]


@pytest.mark.parametrize("what,change,key", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_startup_mistake_is_one_line(tiny_model_dir, tmp_path, what, change, key):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    try:
        server = type("S", (), {"base_url": "http://127.0.0.1:9"})()  # nothing to start for these
        job = user_job(tmp_path, server, tiny_model_dir, **change(held.getsockname()[1]))
        t0 = time.monotonic()
        r = subprocess.run([*AGRPO, "run", str(job)], cwd=job.parent, env=_env(), capture_output=True, text=True,
                           timeout=60, check=False)
        elapsed = time.monotonic() - t0
    finally:
        held.close()
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (what, r.stdout[-1500:], r.stderr[-1500:])
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in r.stderr + r.stdout, (what, r.stderr)
    assert elapsed < 10, (what, elapsed)
