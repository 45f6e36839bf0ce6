"""decode_shapes.py: how many decode shapes the trainer's generator builds (a CUDA graph capture
each, on a GPU) as prompt lengths vary, with and without reusing a kept decoder up to twice a
batch's shape (static_decode.reusable), under the generator's own rules (static_decode.KeptShapes:
row and length buckets, KEPT_DECODERS kept, the least recently used dropped).

  .venv/bin/python benchmarks/decode_shapes.py

Each batch is one step's two prompts (the longer one sets the width) x 8 completions; prompt
lengths uniform in the range, seeded. Prints one row per workload.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agrpo.services.trainer.generation.generator import KEPT_DECODERS  # noqa: E402
from agrpo.services.trainer.generation.static_decode import REUSE_SLACK, KeptShapes  # noqa: E402

WORKLOADS = (  # (shortest prompt, longest prompt, completion tokens)
    (17, 19, 24),  # the race's sums (vs_trl.py's GPU tasks)
    (60, 300, 24),
    (60, 300, 256),
    (100, 1000, 1024),
)


def builds(widths: list[int], tokens: int, slack: float, rows: int = 16) -> int:
    """Decoders built over these batches: the generator's KeptShapes, building nothing."""
    kept: KeptShapes[None] = KeptShapes(KEPT_DECODERS, slack)
    built: list[tuple[int, int]] = []
    for width in widths:
        kept.take(rows, width + tokens, built.append)
    return len(built)


def main() -> int:
    batches = 200
    print(f"decode shapes built in {batches} batches of 2 prompts x 8 completions (KEPT_DECODERS {KEPT_DECODERS})")
    print(f"| prompt tokens | completion tokens | exact buckets (slack 1) | reuse up to {REUSE_SLACK}x (the default) |")
    print("|---|---|---|---|")
    for low, high, tokens in WORKLOADS:
        rng = random.Random(0)
        widths = [max(rng.randint(low, high), rng.randint(low, high)) for _ in range(batches)]
        print(f"| {low}-{high} | {tokens} | {builds(widths, tokens, 1)} | {builds(widths, tokens, REUSE_SLACK)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
