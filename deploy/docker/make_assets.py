"""Write a self-contained demo asset folder: the tiny model and arithmetic prompts.

Used by the CPU-only compose file and the cpu-dev Kubernetes overlay (an init
container), so they run with no model hub and no data set download:

    python make_assets.py /assets [--num-prompts 256] [--seed 0]

Layout: <out>/model (tiny Qwen2 + tokenizer), <out>/data/prompts.jsonl with
`prompt` (chat messages) and `solution` (the answer, for the accuracy reward).
Deterministic for a seed, so every pod that runs it gets identical files.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path


def arithmetic_rows(num: int, seed: int) -> list[dict]:
    """`num` addition prompts with their answers."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
                     "solution": str(a + b)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model_dir, data_file = args.out / "model", args.out / "data" / "prompts.jsonl"
    from agrpo.demo.tiny_model import make_tiny_model  # torch + transformers: lazy

    make_tiny_model(model_dir, seed=args.seed)  # a no-op when the same model is there
    data_file.parent.mkdir(parents=True, exist_ok=True)
    data_file.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(args.num_prompts, args.seed)))
    print(f"assets ready in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
