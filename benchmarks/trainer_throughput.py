"""Trainer step throughput on the tiny model (CPU by default): tokens/s, tree vs unpacked.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/trainer_throughput.py [--steps 10] [--groups 4] \
        [--group-size 8] [--prompt-len 64] [--completion-len 64]

Samples are GRPO-shaped (groups share their prompt). "forward tok/s" counts the tokens
the model actually forwards (unique tokens with prefix-tree packing); "sample tok/s"
counts the raw sample tokens the step trained on, which is what a user feeds in.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def make_samples(groups: int, size: int, prompt_len: int, completion_len: int, seed: int = 0):
    from agrpo.services.trainer.sample import Sample

    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(3, 1000) for _ in range(prompt_len)]
        for k in range(size):
            comp = [rng.randrange(3, 1000) for _ in range(completion_len)]
            ids = prompt + comp
            mask = [0] * prompt_len + [1] * completion_len
            out.append(Sample(f"{g}-{k}", f"g{g}", (g, 0), 0, ids, mask,
                              [-rng.uniform(4, 8) if m else 0.0 for m in mask], rng.uniform(-1, 1)))
    return out


def run(tree: bool, args, model_dir: str) -> dict:
    import torch

    from agrpo.services.common.config import AgrpoConfig
    from agrpo.services.trainer.engine_factory import build_engine
    from agrpo.services.trainer.packing import TokenBudgetBatcher, iter_batches

    cfg = AgrpoConfig(model=model_dir, gradient_checkpointing=args.gc)
    engine, _, _ = build_engine(cfg, model_dir)
    engine.cfg.tree = tree
    samples = make_samples(args.groups, args.group_size, args.prompt_len, args.completion_len)
    batches = list(iter_batches(TokenBudgetBatcher(1, args.budget), samples))
    forward = sum(mb.num_forward_tokens for mb in batches)
    raw = sum(len(s) for s in samples)
    engine.train_step(batches)  # warm-up
    t0 = time.perf_counter()
    for _ in range(args.steps):
        engine.train_step(batches)
    dt = (time.perf_counter() - t0) / args.steps
    return {"mode": "tree" if tree else "unpacked", "threads": torch.get_num_threads(),
            "micro_batches": len(batches), "samples": len(samples), "raw_tokens": raw,
            "forward_tokens": forward if tree else raw, "step_s": dt,
            "forward_tok_s": (forward if tree else raw) / dt, "sample_tok_s": raw / dt}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--completion-len", type=int, default=64)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--gc", action="store_true", help="gradient checkpointing on (the default config)")
    args = p.parse_args()
    from agrpo.demo.tiny_model import make_tiny_model

    model_dir = str(make_tiny_model(Path(".cache/tiny-model/seed0"), seed=0))
    rows = [run(True, args, model_dir), run(False, args, model_dir)]
    cols = ["mode", "threads", "micro_batches", "samples", "raw_tokens", "forward_tokens", "step_s",
            "forward_tok_s", "sample_tok_s"]
    print(" | ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(" | ".join(f"{r[c]:>14.3f}" if isinstance(r[c], float) else f"{r[c]:>14}" for c in cols))


if __name__ == "__main__":
    main()
