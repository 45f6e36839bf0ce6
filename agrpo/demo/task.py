"""The demo's task: arithmetic prompts, and rewards the demo's models can learn.

A random 0.5M-parameter model cannot do arithmetic, so the tiny demo rewards the share
of digits in the answer (`digit_share`): its group variance is non-zero from the first
step and GRPO can raise it within minutes on a CPU.

SmolLM2-135M-Instruct gets one-digit sums. It answers in prose; TRL's `accuracy` reads
only a `\\boxed{}` answer, which it boxes in a few percent of its first completions, so
that reward is 0.0 for almost every group and GRPO has nothing to follow. `final_answer`
reads the box first and otherwise the last number written: about a quarter of the first
completions earn it, and GRPO raises that within twenty steps on two cores.
(A format reward for the box was tried: with half credit for an empty box the model
learnt to write `a + b = \\boxed{}`, and with credit for a boxed number only, it never
earned it.)

These are also the examples of user reward functions loaded by `module:callable`,
called exactly as TRL calls one.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path


def write_arithmetic_dataset(path: Path, num_prompts: int, seed: int = 0, instruction: str = "",
                             max_operand: int = 50) -> Path:
    """JSONL rows {"prompt": [user message], "solution": "<answer>"} (conversational format),
    a + b with both in [0, max_operand]."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for _ in range(num_prompts):
            a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
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


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+")


def final_answer(completions, solution, **kwargs) -> list[float]:
    """1.0 if the answer equals the solution, else 0.0. The answer is the last non-empty
    `\\boxed{}`'s content, or, when nothing is boxed, the last number in the completion."""
    out = []
    for completion, gold in zip(completions, solution, strict=True):
        text = _text(completion)
        boxes = [b.strip() for b in _BOXED.findall(text) if b.strip()]
        numbers = _NUMBER.findall(text)
        answer = boxes[-1] if boxes else numbers[-1] if numbers else None
        out.append(float(answer == str(gold).strip()))
    return out
