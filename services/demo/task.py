"""The demo's task: arithmetic prompts, and a reward a random tiny model can learn.

A random 0.5M-parameter model cannot do arithmetic, so the tiny demo rewards the share
of digits in the answer (`digit_share`): its group variance is non-zero from the first
step and GRPO can raise it within minutes on a CPU. The SmolLM2 option uses the real
`accuracy` built-in on the same prompts. `digit_share` is also the example of a user
reward function loaded by `module:callable`, called exactly as TRL calls one.
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def write_arithmetic_dataset(path: Path, num_prompts: int, seed: int = 0, instruction: str = "") -> Path:
    """JSONL rows {"prompt": [user message], "solution": "<answer>"} (conversational format)."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for _ in range(num_prompts):
            a, b = rng.randint(0, 50), rng.randint(0, 50)
            row = {"prompt": [{"role": "user", "content": f"What is {a} + {b}?{instruction}"}],
                   "solution": str(a + b)}
            f.write(json.dumps(row) + "\n")
    return path


def _text(completion) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role") == "assistant")


def digit_share(completions, **kwargs) -> list[float]:
    """Share of the completion's non-space characters that are digits, in [0, 1]."""
    out = []
    for completion in completions:
        chars = [c for c in _text(completion) if not c.isspace()]
        out.append(sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0)
    return out
