"""`agrpo demo`: train the tiny model (or SmolLM2) with the whole system on this machine.

Run: make demo   (or: .venv/bin/agrpo demo --steps 40)
Writes <out>/metrics.jsonl, <out>/reward_loss.png, <out>/summary.json and service logs.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def parse(argv: list[str]):
    """Demo options from the command line."""
    from .runner import DemoOptions

    p = argparse.ArgumentParser(prog="agrpo demo", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny",
                   help="tiny: random 0.5M model, digit-share reward; smollm2: SmolLM2-135M, accuracy")
    p.add_argument("--steps", type=int, default=80, help="optimizer steps (default 80)")
    p.add_argument("--epochs", type=float, default=None, help="train this many epochs instead of --steps")
    p.add_argument("--num-prompts", type=int, default=64, help="arithmetic prompts in the dataset")
    p.add_argument("--learning-rate", type=float, default=None)
    p.add_argument("--out", type=Path, default=Path("demo_output"))
    p.add_argument("--cache", type=Path, default=Path(".cache"))
    p.add_argument("--timeout", type=float, default=1800, help="give up after this many seconds")
    a = p.parse_args(argv)
    return DemoOptions(model=a.model, steps=a.steps, num_prompts=a.num_prompts, epochs=a.epochs,
                       out=a.out.resolve(), cache=a.cache.resolve(), learning_rate=a.learning_rate, timeout_s=a.timeout)


def main(argv: list[str]) -> int:
    """Run the demo; print its summary; 0 on success."""
    from .runner import run

    opts = parse(argv)
    # SIGTERM unwinds like Ctrl-C, so the runner's cleanup stops every child process.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        result = run(opts)
    except KeyboardInterrupt:
        print("\n[demo] interrupted: every process it started has been stopped")
        return 130
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"\n[demo] failed: {exc}\n[demo] logs: {opts.out / 'logs'}", file=sys.stderr)
        return 1
    print(f"\n[demo] {result['steps']} steps in {result['wall_s']:.0f} s | reward first 10 steps "
          f"{result['reward_first10']:.3f} -> last 10 steps {result['reward_last10']:.3f} "
          f"({result['reward_gain']:+.3f})")
    print(f"[demo] max staleness of a trained sample {result['max_trained_staleness']} "
          f"(limit {result['max_staleness']}); plot: {result['plot']}; metrics: {opts.out / 'metrics.jsonl'}")
    return 0
