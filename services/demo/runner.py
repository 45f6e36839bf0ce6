"""Run the whole system on localhost: vLLM, reward, trainer and rollout as processes.

Each process gets OMP_NUM_THREADS=1 (2-core machines). The trainer's metrics JSONL is
followed to print a line per step; when the trainer finishes, everything is stopped
(also on Ctrl-C or a failure), a plot and a summary are written.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from services.common.vllm_process import VLLMServer, free_port

from . import models, report
from .processes import ServiceProcess, agrpo_argv, trainer_done
from .task import write_arithmetic_dataset


@dataclass
class DemoOptions:
    """What `agrpo demo` was asked for."""

    model: str = "tiny"
    steps: int = 80
    num_prompts: int = 64
    epochs: float | None = None
    out: Path = Path("demo_output")
    cache: Path = Path(".cache")
    learning_rate: float | None = None
    timeout_s: float = 1800


def _task_settings(opts: DemoOptions) -> dict:
    if opts.model == "smollm2":
        return {"reward_funcs": [{"name": "accuracy"}], "max_completion_length": 48,
                "learning_rate": opts.learning_rate or 1e-5, "temperature": 0.9}
    return {"reward_funcs": [{"name": "services.demo.task:digit_share"}], "max_completion_length": 24,
            "learning_rate": opts.learning_rate or 3e-3, "temperature": 1.0}


def write_config(opts: DemoOptions, model_dir: Path, data: Path, vllm_url: str) -> Path:
    """The one config file all three services read."""
    ports = {svc: free_port() for svc in ("trainer", "rollout", "reward")}
    cfg = {
        "model": str(model_dir), "vllm_server_base_url": vllm_url,
        "dataset": {"path": "json", "data_files": str(data), "split": "train"},
        "num_generations": 8, "per_device_train_batch_size": 16, "max_staleness": 2,
        "output_dir": str(opts.out / "trainer_output"), "save_steps": 10_000, "seed": 0,
        "gradient_checkpointing": False, "logging_steps": 1,
        **({"num_train_epochs": opts.epochs} if opts.epochs else {"max_steps": opts.steps}),
        **_task_settings(opts),
        "trainer": {"port": ports["trainer"], "metrics_port": None,
                    "metrics_jsonl": str(opts.out / "metrics.jsonl")},
        "rollout": {"port": ports["rollout"], "metrics_port": None},
        "reward": {"port": ports["reward"], "metrics_port": None, "num_workers": 1},
    }
    path = opts.out / "agrpo.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _follow(metrics: Path, trainer: ServiceProcess, trainer_addr: str, others: list[ServiceProcess],
            total: int | None, timeout_s: float) -> list[dict]:
    """Print a line per new step until the trainer is done; return every step record."""
    from tqdm import tqdm

    bar = tqdm(total=total, unit="step", dynamic_ncols=True, leave=True)
    seen, t_end = 0, time.monotonic() + timeout_s
    try:
        while True:
            rows = report.read_steps(metrics)
            for row in rows[seen:]:
                bar.write(report.step_line(row))
                bar.update(1)
            seen = len(rows)
            if not trainer.alive():
                raise RuntimeError(f"trainer exited with code {trainer.proc.returncode}:\n{trainer.log_tail()}")
            if trainer_done(trainer_addr):
                return report.read_steps(metrics)
            for proc in others:  # rollout exits 0 by itself once training is done
                if not proc.alive() and proc.proc.returncode != 0:
                    raise RuntimeError(f"{proc.name} died:\n{proc.log_tail()}")
            if time.monotonic() > t_end:
                raise TimeoutError(f"demo did not finish within {timeout_s:.0f} s")
            time.sleep(0.5)
    finally:
        bar.close()


def run(opts: DemoOptions) -> dict:
    """Start everything, train, stop everything; return the summary."""
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "metrics.jsonl").unlink(missing_ok=True)
    model_dir = models.smollm2(opts.cache) if opts.model == "smollm2" else models.tiny_model(opts.cache)
    # math-verify (the accuracy reward) reads a \boxed{} answer first.
    instruction = " Put the final answer in \\boxed{}." if opts.model == "smollm2" else ""
    data = write_arithmetic_dataset(opts.out / "prompts.jsonl", opts.num_prompts, instruction=instruction)
    logs, started = opts.out / "logs", []
    t0 = time.monotonic()
    try:
        print(f"[demo] starting vLLM on {model_dir.name} (20-60 s on a CPU)", flush=True)
        vllm = VLLMServer(model_dir).start()
        started.append(vllm)
        config = write_config(opts, model_dir, data, vllm.base_url)
        cfg = yaml.safe_load(config.read_text())
        procs = {}
        for svc, ready_s in (("reward", 120), ("trainer", 300), ("rollout", 120)):
            print(f"[demo] starting {svc}", flush=True)
            proc = ServiceProcess(svc, agrpo_argv(svc, config), logs / f"{svc}.log").start()
            started.append(proc)
            proc.wait_healthy(f"127.0.0.1:{cfg[svc]['port']}", "", ready_s)
            procs[svc] = proc
        total = None if opts.epochs else opts.steps
        rows = _follow(opts.out / "metrics.jsonl", procs["trainer"], f"127.0.0.1:{cfg['trainer']['port']}",
                       [procs["reward"], procs["rollout"]], total, opts.timeout_s)
    finally:
        for proc in reversed(started):
            proc.stop()
    result = report.summary(rows, time.monotonic() - t0, cfg["max_staleness"])
    result["plot"] = str(report.plot(rows, opts.out / "reward_loss.png")) if rows else None
    (opts.out / "summary.json").write_text(json.dumps(result, indent=2))
    return result
