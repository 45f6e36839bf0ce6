"""User reward functions for the reward-service tests, written as a TRL user would.

Loaded by the server's worker processes as `reward_user_funcs:<name>` (this folder is
on sys.path through pytest's `pythonpath`, or PYTHONPATH for the subprocess server).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import threading
import time


def reward_len(completions, **kwargs):
    """TRL's documented example: prefer completions of about 20 characters."""
    return [-abs(20 - len(completion[0]["content"])) for completion in completions]


def format_reward(completions, **kwargs):
    """TRL's documented example: completions shaped `<think>...</think><answer>...</answer>`."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.match(pattern, c) else 0.0 for c in contents]


async def async_len(completions, **kwargs):
    """An async reward: length of a standard completion."""
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


class ColumnEcho:
    """A callable class instance needing the `score` column; echoes it."""

    def __call__(self, completions, score, **kwargs):
        return [float(s) for s in score]


column_echo = ColumnEcho()


def scaled(completions, factor, **kwargs):
    """Configured with kwargs {factor: ...}, i.e. wrapped in functools.partial."""
    return [factor * len(c) for c in completions]


def math_only(completions, kind, **kwargs):
    """None (not applicable) for items whose `kind` column is not 'math'."""
    return [1.0 if k == "math" else None for k in kind]


def shape_probe(prompts, completions, completion_ids, **kwargs):
    """Checks TRL's shapes: conversational -> message dicts, standard -> str; ints stay ints."""
    out = []
    for prompt, completion, ids, meta in zip(prompts, completions, completion_ids, kwargs["meta"]):
        if isinstance(completion, list):
            ok = all(set(m) >= {"role", "content"} for m in completion + prompt)
        else:
            ok = isinstance(completion, str) and isinstance(prompt, str)
        ok = ok and all(isinstance(i, int) for i in ids) and isinstance(meta["n"], int)
        out.append(1.0 if ok else 0.0)
    return out


def main_thread_probe(completions, **kwargs):
    """1.0 when called in the main thread, where SIGALRM-based timeouts work."""
    ok = threading.current_thread() is threading.main_thread()
    if ok:
        signal.alarm(0)  # raises ValueError off the main thread
    return [1.0 if ok else 0.0] * len(completions)


def raises(completions, **kwargs):
    raise RuntimeError("boom")


def sleeps(completions, **kwargs):
    time.sleep(3600)
    return [0.0] * len(completions)


def nap(completions, **kwargs):
    time.sleep(1.5)
    return [0.0] * len(completions)


def non_finite(completions, **kwargs):
    return [math.nan, math.inf, 1.0][: len(completions)]


def wrong_length(completions, **kwargs):
    return [1.0] * (len(completions) + 1)


def returns_none(completions, **kwargs):
    return None


def exits(completions, **kwargs):
    raise SystemExit(3)


def pid_then_sleep(completions, pid_file, **kwargs):
    """Writes the worker's pid where the test can find it, then waits to be killed."""
    with open(pid_file[0], "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(3600)
    return [0.0] * len(completions)


def nap_short(completions, **kwargs):
    time.sleep(0.05)
    return [0.0] * len(completions)


def worker_pid(completions, **kwargs):
    """The worker process's pid, so a test can kill it while it is idle."""
    return [float(os.getpid())] * len(completions)


def huge_values(completions, **kwargs):
    """Finite but huge: 1e308 (times a weight, past the double range) and an int that is
    beyond it on its own."""
    return [1e308, 10**400, -1e308][: len(completions)]
