"""Async against the sync schedule on the same stack: speed-up next to the ideal, idle and stale shares.

Run:  .venv/bin/python benchmarks/async_speedup.py --steps 30 [--staleness 1,2,4] [--seeds 0]

Each run is one `agrpo demo` (real vLLM, reward, trainer and rollout processes) with the same
data, model and seed, and fixed-count steps (token_budget 0: every step trains
per_device_train_batch_size samples); only `trainer.schedule` (sync: generate one step, train,
sync, repeat) and `max_staleness` differ. On a CPU machine vLLM's engine and model run alone on
core 0; the trainer, rollout, reward and vLLM's API server share core 1 (taskset, `--pin`), so
generation and training really run in parallel. (With rollout and reward beside vLLM, its core
was the bottleneck of both schedules, and its API server took a third of that core: the numbers
are in docs/measurements/async-measurements.md.)

Per run, after `--warmup` steps: step time; for sync, Tg (waiting for samples) and Tt (the rest of
a step: train and weight sync), the ideal async speed-up (Tg + Tt) / max(Tg, Tt), and ideal_ws, the
same with the weight sync (vLLM paused while weights load) kept serial; for async, the speed-up over
sync and its share of the ideal; trainer idle % (waiting for samples); generation
idle % (no request in flight at vLLM); samples dropped stale / generated; the last-10 reward and
the wall time until the last-10 mean reward first reaches --good. With several seeds it adds the
mean +- std per schedule and plots reward against step and against wall time (learning.png).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def _vals(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) if isinstance(r.get(key), (int, float)) else 0.0 for r in rows]


def time_to_reward(rows: list[dict], good: float, window: int = 10, after_first: bool = False) -> float | None:
    """Seconds until the trailing `window`-step mean reward >= good: from the trainer's start
    (its wait for the first step's samples included), or with `after_first` from the end of the
    first step, which leaves out the start-up both schedules share (rollout connecting, the
    first batch)."""
    if not rows:
        return None
    first = rows[0]
    t0 = first["time"] if after_first else \
        first["time"] - float(first.get("perf/step_s", 0)) - float(first.get("perf/wait_s", 0))
    rewards = _vals(rows, "reward")
    for i in range(window - 1, len(rows)):
        if statistics.fmean(rewards[i - window + 1:i + 1]) >= good:
            return rows[i]["time"] - t0
    return None


def run_numbers(summary: dict, rows: list[dict], warmup: int, group_size: int, good: float) -> dict:
    """What one run measured (see the module docstring)."""
    steady = rows[warmup:]
    span = steady[-1]["time"] - rows[warmup - 1]["time"] if warmup > 0 else steady[-1]["time"] - steady[0]["time"]
    step_s = span / max(len(steady), 1)
    wait = statistics.fmean(_vals(steady, "perf/wait_s"))
    from agrpo.demo.report import stale_share

    stale, share = stale_share(summary, group_size)
    generated = summary.get("samples_generated", 0)
    drops = summary.get("rollout_drops", {})
    gen_s = summary.get("generation_s", 0.0)
    return {"steps": len(rows), "step_s": step_s, "tg": wait, "tt": step_s - wait,
            "sync_s": statistics.fmean(_vals(steady, "perf/weight_sync_s")),
            "trainer_idle": sum(_vals(steady, "perf/wait_s")) / span if span > 0 else math.nan,
            "generation_idle": summary.get("generation_idle_s", 0.0) / gen_s if gen_s else math.nan,
            "stale_share": share, "stale_samples": stale,
            "generated": generated, "aborted_in_flight": drops.get("stale_inflight", 0),
            "reward_last10": summary.get("reward_last10"), "time_to_good_s": time_to_reward(rows, good),
            "time_to_good_after_first_s": time_to_reward(rows, good, after_first=True),
            "max_trained_staleness": summary.get("max_trained_staleness")}


def demo_options(label: str, schedule: str, staleness: int, seed: int, a, variant: dict | None = None):
    """The demo of run `label`_seed`seed`: sync, async, or async with a variant's extra config."""
    from agrpo.demo import runner
    from agrpo.services.common.config.loader import merge

    overrides = {"token_budget": 0, "seed": seed, "launcher": {"generation": "vllm"}}  # the vLLM stack
    for extra in (a.set or {}, variant or {}):
        merge(overrides, extra)
    merge(overrides, {"trainer": {"schedule": schedule}})
    return runner.DemoOptions(steps=a.steps, num_prompts=a.num_prompts, out=a.out / f"{label}_seed{seed}",
                              cache=a.cache, max_staleness=staleness, learning_rate=a.learning_rate,
                              overrides=overrides, cpus={} if a.no_pin else a.pin)


def run_one(label: str, schedule: str, staleness: int, seed: int, a, variant: dict | None = None) -> dict:
    """One demo run and its numbers."""
    from agrpo.demo import runner
    from agrpo.launcher.progress import read_steps

    name, opts = f"{label}_seed{seed}", demo_options(label, schedule, staleness, seed, a, variant)
    print(f"[bench] {name}: schedule={schedule} max_staleness={staleness} seed={seed}", flush=True)
    summary = runner.run(opts)
    rows = read_steps(opts.out / "metrics.jsonl")
    return {"name": name, "schedule": schedule, "max_staleness": staleness, "seed": seed,
            "variant": label, **run_numbers(summary, rows, a.warmup, 8, a.good)}


def _or_nan(v: float | None) -> float:
    return float("nan") if v is None else v


def _pct(v) -> str:
    return "   -" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:4.1f}"


def table(results: list[dict]) -> list[str]:
    """One line per run; async runs against the sync run of the same seed."""
    sync = {r["seed"]: r for r in results if r["schedule"] == "sync"}
    head = ("run                    step_s    Tg    Tt  ideal ideal_ws speedup  share  tr_idle%  gen_idle%  stale%  "
            "reward10  t_good_s  after_1st_s")
    lines = [head, "-" * len(head)]
    for r in results:
        base = sync.get(r["seed"])
        ideal = ideal_ws = speedup = share = None
        if base is not None:
            tg, tt, ws = base["tg"], base["tt"], base["sync_s"]
            ideal = (tg + tt) / max(tg, tt) if max(tg, tt) > 0 else None
            # vLLM is paused while weights load: that part of Tt cannot overlap generation.
            ideal_ws = (tg + tt) / (ws + max(tg, tt - ws)) if tg + tt > 0 else None
            if r["schedule"] == "async":
                speedup = base["step_s"] / r["step_s"]
                share = speedup / ideal if ideal else None
        lines.append(
            f"{r['name']:<22} {r['step_s']:6.2f} {r['tg']:5.2f} {r['tt']:5.2f} "
            f"{ideal if ideal else float('nan'):6.2f} {ideal_ws if ideal_ws else float('nan'):8.2f} "
            f"{speedup if speedup else float('nan'):7.2f} "
            f"{_pct(share):>6} {_pct(r['trainer_idle']):>9} {_pct(r['generation_idle']):>10} "
            f"{_pct(r['stale_share']):>7} {r['reward_last10'] or float('nan'):9.3f} "
            f"{_or_nan(r['time_to_good_s']):9.1f} "
            f"{_or_nan(r['time_to_good_after_first_s']):12.1f}")
    return lines


def _mean_std(values: list) -> tuple[float, float, int] | None:
    reached = [v for v in values if v is not None]
    return (statistics.fmean(reached), statistics.pstdev(reached), len(reached)) if reached else None


def aggregate(results: list[dict], good: float) -> list[str]:
    """Mean +- std over seeds per variant: last-10 reward, time to the reward from the trainer's
    start and from the end of the first step, and both against sync."""
    lines, means = [], {}
    for variant in dict.fromkeys(r["variant"] for r in results):
        runs = [r for r in results if r["variant"] == variant]
        if len(runs) < 2:
            continue
        rew = [r["reward_last10"] for r in runs if r["reward_last10"] is not None]
        line = f"{variant}: last-10 reward {statistics.fmean(rew):.3f} +- {statistics.pstdev(rew):.3f} (n={len(rew)})"
        for key, label in (("time_to_good_s", "time to reward"), ("time_to_good_after_first_s", "after the 1st step")):
            stats = _mean_std([r[key] for r in runs])
            means[variant, key] = stats[0] if stats else None
            line += (f" | {label} {stats[0]:.1f} +- {stats[1]:.1f} s ({stats[2]}/{len(runs)} reached it)"
                     if stats else f" | {label}: not reached")
            base = means.get(("sync", key))
            if stats and base and variant != "sync":
                line += f", {stats[0] / base:.2f}x of sync"
        lines.append(line)
    return lines


def plot(results: list[dict], out: Path) -> Path | None:
    """Reward against step and against wall time, every run."""
    try:
        import matplotlib
    except ImportError:
        return None
    from agrpo.launcher.progress import read_steps

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors, seen = {"sync": "tab:blue"}, set()
    for r in results:
        rows = read_steps(out / r["name"] / "metrics.jsonl")
        if not rows:
            continue
        label = r["variant"]  # sync, async_s2, async_s2_<variant>: one color each
        color = colors.setdefault(label, f"C{len(colors) + 1}")
        first = label not in seen
        seen.add(label)
        t0 = rows[0]["time"] - float(rows[0].get("perf/step_s", 0)) - float(rows[0].get("perf/wait_s", 0))
        rewards = _vals(rows, "reward")
        by_step.plot([x["step"] for x in rows], rewards, color=color, alpha=0.7, label=label if first else None)
        by_time.plot([x["time"] - t0 for x in rows], rewards, color=color, alpha=0.7)
    by_step.set_xlabel("optimizer step")
    by_time.set_xlabel("wall time since the first step (s)")
    for ax in (by_step, by_time):
        ax.set_ylabel("reward (step mean)")
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=7)
    fig.tight_layout()
    path = out / "learning.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_plan(seeds: list[int], stalenesses: list[int], variants: list[tuple[str, dict]]) -> list[tuple]:
    """(label, schedule, max_staleness, seed, variant) per run: per seed sync, then every async
    staleness, each followed by its variants."""
    plan = []
    for seed in seeds:
        plan.append(("sync", "sync", 0, seed, None))
        for s in stalenesses:
            plan.append((f"async_s{s}", "async", s, seed, None))
            plan += [(f"async_s{s}_{name}", "async", s, seed, variant) for name, variant in variants]
    return plan


PIN_KEYS = ("vllm", "vllm_front", "trainer", "rollout", "reward")


def pin_spec(text: str) -> dict[str, str]:
    """argparse type: "vllm=0,trainer=1" -> {"vllm": "0", "trainer": "1"} (a range as 0-1),
    every key one of PIN_KEYS and every core one this process may use."""
    import os

    from agrpo.launcher.affinity import cores

    usable, out = os.sched_getaffinity(0), {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if key not in PIN_KEYS or not sep:
            raise argparse.ArgumentTypeError(f"{item!r}: want name=cores, name one of {', '.join(PIN_KEYS)}")
        try:
            wanted = cores(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: not a core number or range (e.g. 0 or 0-1)") from None
        if not wanted <= usable:
            raise argparse.ArgumentTypeError(f"{item!r}: cores {sorted(wanted - usable)} are not usable here "
                                             f"(usable: {sorted(usable)})")
        out[key] = value
    return out


def config_json(text: str) -> dict:
    """--set's value: a JSON object of config keys."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"want a JSON object of config keys, got {text!r}")
    return value


def named_variant(text: str) -> tuple[str, dict]:
    """--variant's value: NAME=JSON."""
    name, sep, body = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"want NAME=JSON, got {text!r}")
    return name, config_json(body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--staleness", default="1,2,4", help="async runs: max_staleness values")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (each runs sync and every async)")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the timings")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=None)
    p.add_argument("--good", type=float, default=0.9, help="the reward whose first arrival is timed")
    p.add_argument("--set", type=config_json, default=None, help='extra config as JSON, e.g. \'{"tis_cap": 2}\'')
    p.add_argument("--variant", type=named_variant, action="append", default=[], metavar="NAME=JSON",
                   help="also run every async staleness with this extra config (repeatable), "
                        "e.g. 'cw24={\"trainer\": {\"credit_window\": 24}}'")
    p.add_argument("--pin", type=pin_spec, default="vllm=0,vllm_front=1,rollout=1,reward=1,trainer=1",
                   help="service=cores for taskset (default: vLLM's engine and model alone on core 0; "
                        "its API server (vllm_front), the trainer, rollout and reward on core 1)")
    p.add_argument("--no-pin", action="store_true", help="do not pin vLLM and the trainer to cores")
    p.add_argument("--out", type=Path, default=Path("bench_output/async_speedup"))
    p.add_argument("--cache", type=Path, default=Path(".cache"))
    a = p.parse_args(argv)
    if a.steps <= a.warmup:
        p.error(f"--steps {a.steps} leaves nothing to time after --warmup {a.warmup}")
    from agrpo.demo import runner
    from agrpo.services.common.config import ConfigError

    results: list[dict] = []
    plan = run_plan([int(x) for x in a.seeds.split(",")], [int(x) for x in a.staleness.split(",") if x], a.variant)
    try:
        for run in plan:  # every run's config, before the first vLLM starts
            runner.check_config(demo_options(*run[:4], a, run[4]))
        for label, schedule, staleness, seed, variant in plan:
            results.append(run_one(label, schedule, staleness, seed, a, variant))
            (a.out / "speedup.json").write_text(json.dumps(results, indent=2))  # kept if stopped later
    except KeyboardInterrupt:  # the demo has stopped its processes
        print(f"\n[bench] interrupted after {len(results)} of {len(plan)} runs"
              + (f"; they are in {a.out / 'speedup.json'}" if results else ""), file=sys.stderr)
        return 130
    except ConfigError as exc:  # a key of --set or --variant, or an AGRPO_* variable; before vLLM starts
        print(f"[bench] config error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(table(results) + aggregate(results, a.good)))
    path = plot(results, a.out)
    if path:
        print(f"[bench] plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
