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

`--task word-problems` gives SmolLM2 multi-step arithmetic word problems instead
(`write_word_problems_dataset`): one to four operations, so a correct chain of thought runs
from one line to several and completion lengths vary within a step. Its reward is the same
`final_answer`: every answer is one plain positive integer that a correct chain ends on, so the
last-number rule reads a solution as a person would. Before training SmolLM2 earns it on 8% of
its temperature-1 samples (19% of the one-operation problems, 6% of two and three, none of four;
16 samples each, 320 tokens), so groups of the easy problems vary and GRPO has something to
follow, as on the sums. Partial credit for intermediate results was not taken: it would need a
column the rows do not have, and it pays for writing many numbers.

These are also the examples of user reward functions loaded by `module:callable`,
called exactly as TRL calls one.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
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


BOX_INSTRUCTION = " Put the final answer in \\boxed{}."


@dataclass(frozen=True)
class WordProblem:
    """One generated problem: its text, its answer and the reference chain of thought (one
    line per arithmetic operation, e.g. ["3 * 7 = 21", "21 - 5 = 16"])."""

    question: str
    answer: int
    steps: tuple[str, ...]


_PEOPLE = (("Tom", "he", "him"), ("Anna", "she", "her"), ("Ravi", "he", "him"), ("Mia", "she", "her"),
           ("Omar", "he", "him"), ("Sara", "she", "her"), ("Leo", "he", "him"), ("Ella", "she", "her"))
_ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "stamps", "shells")


def word_problem(rng: random.Random, num_ops: int | None = None) -> WordProblem:
    """A word problem of `num_ops` arithmetic operations (default: 1 to 4, uniform), drawn from `rng`.

    A person starts with some items (or with boxes of them: a multiplication), then each
    sentence changes the count: buys or finds more (+), gives some away or loses some (-), buys
    more boxes (x then +: two operations), the count doubles or triples (x), or, last only,
    shares them equally among friends (/, always exact). Every intermediate count is a positive
    integer below 1000, so the answer is one plain number (no sign, decimal point or thousands
    separator): `final_answer`'s last-number rule reads it the way a person would, and a
    correct chain of thought ends on it."""
    n = num_ops if num_ops is not None else rng.randint(1, 4)
    if not 1 <= n <= 4:
        raise ValueError(f"num_ops={n}: 1 to 4")
    name, he, him = rng.choice(_PEOPLE)
    she = he.capitalize()
    item = rng.choice(_ITEMS)
    steps: list[str] = []
    sentences: list[str] = []
    box = None
    if rng.random() < 0.5:
        a, box = rng.randint(2, 6), rng.randint(2, 9)
        value = a * box
        sentences.append(f"{name} has {a} boxes of {box} {item}.")
        steps.append(f"{a} * {box} = {value}")
    else:
        value = rng.randint(5, 20)
        sentences.append(f"{name} has {value} {item}.")
    question = f"How many {item} does {name} have now?"
    while len(steps) < n:
        left = n - len(steps)
        ops = ["add"] + (["sub"] if value >= 2 else []) + (["boxes"] if box and left >= 2 else [])
        ops += ["times"] if value <= 100 else []
        divisors = [k for k in range(2, 7) if value % k == 0 and value > k]
        ops += ["share"] if left == 1 and divisors else []
        op = rng.choice(ops)
        if op == "add":
            x = rng.randint(2, 20)
            sentences.append(rng.choice([f"{she} buys {x} more.", f"{she} finds {x} more.",
                                         f"A friend gives {him} {x} more."]))
            steps.append(f"{value} + {x} = {value + x}")
            value += x
        elif op == "sub":
            x = rng.randint(1, min(value - 1, 20))
            sentences.append(rng.choice([f"{she} gives {x} to a friend.", f"{she} loses {x}.",
                                         f"{she} gives away {x}."]))
            steps.append(f"{value} - {x} = {value - x}")
            value -= x
        elif op == "boxes":
            k = rng.randint(2, 4)
            sentences.append(f"{she} buys {k} more boxes.")
            steps += [f"{k} * {box} = {k * box}", f"{value} + {k * box} = {value + k * box}"]
            value += k * box
        elif op == "times":
            k = rng.choice([2, 3])
            sentences.append(f"Then the number of {item} {he} has {'doubles' if k == 2 else 'triples'}.")
            steps.append(f"{value} * {k} = {value * k}")
            value *= k
        else:
            k = rng.choice(divisors)
            sentences.append(f"{she} shares them equally among {k} friends.")
            question = f"How many {item} does each friend get?"
            steps.append(f"{value} / {k} = {value // k}")
            value //= k
    if len(sentences) == 1:  # the boxes alone: nothing changed
        question = f"How many {item} does {name} have?"
    return WordProblem(" ".join([*sentences, question]), value, tuple(steps))


def write_word_problems_dataset(path: Path, n: int, seed: int = 0, instruction: str = BOX_INSTRUCTION) -> Path:
    """JSONL rows {"prompt": [user message], "solution": "<answer>"} (the format of
    write_arithmetic_dataset, which both TRL and agrpo read): `n` word problems from `seed`
    (`word_problem`), each asking for a boxed answer."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for _ in range(n):
            problem = word_problem(rng)
            row = {"prompt": [{"role": "user", "content": problem.question + instruction}],
                   "solution": str(problem.answer)}
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
