"""Per-item time limits, so one slow item costs its own score and not its group's.

A worker runs one call at a time in its main thread, within the call's budget
(`reward.call_timeout_s`); past it the parent kills the worker and every item of the
call is TIMEOUT. A function whose items are independent (the math built-ins) scores
them through `score_each`: each item runs under a SIGALRM timer, and an item that runs
out of time comes back as `TimedOut` (status TIMEOUT) while the others keep their values.

An item's limit is the smaller of
- the function's per-item limit (`limit_s`, e.g. `accuracy`'s `item_timeout_s`), and
- its fair share of what is left of the call's budget (left / items still to score),
so that however many slow items a group has, the fast ones are still scored and the call
returns before the parent's deadline. Items cut short by their share rather than by
their own limit get a second try with the budget that is left after the first pass.

Signals only work in the main thread. Elsewhere (TRL's `asyncio.to_thread`) items run
without limits, as they do in TRL.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .results import TimedOut

MARGIN_S = 0.25
"""Kept back from a call's budget to pickle the result and send it to the parent."""

_call_end: float | None = None


@contextlib.contextmanager
def call_budget(seconds: float | None) -> Iterator[None]:
    """Around one call in a worker: the call must return within `seconds`."""
    global _call_end
    _call_end = None if seconds is None else time.monotonic() + max(0.0, seconds - MARGIN_S)
    try:
        yield
    finally:
        _call_end = None


class _Expired(BaseException):
    """Raised inside an item by its timer. A BaseException, so that reward code that
    catches Exception (math-verify and sympy do) cannot swallow it."""


def _expire(signum: int, frame: Any) -> None:
    raise _Expired


def _run_limited(fn: Callable[[], Any], seconds: float) -> Any:
    previous = signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, previous)


def _share(items_left: int) -> float | None:
    """Seconds of the call's budget one of `items_left` items may use; None: no budget."""
    if _call_end is None:
        return None
    return max(0.0, _call_end - time.monotonic()) / items_left


def score_each(num_items: int, score_one: Callable[[int], Any],
               limit_s: float | None) -> list[Any]:
    """[score_one(i) for i in range(num_items)], each item within its limit (see above);
    an item past it is `TimedOut`."""
    if threading.current_thread() is not threading.main_thread():
        return [score_one(i) for i in range(num_items)]
    out: list[Any] = [None] * num_items
    todo = list(range(num_items))
    for _ in range(2):  # the second pass retries items that only their share cut short
        cut = []
        for k, i in enumerate(todo):
            share = _share(len(todo) - k)
            limits = [x for x in (limit_s, share) if x is not None]
            limit = min(limits) if limits else None
            by_share = share is not None and (limit_s is None or share < limit_s)
            if limit is None:
                out[i] = score_one(i)
                continue
            if limit <= 0:
                out[i] = TimedOut("the call's time budget (reward.call_timeout_s) was spent "
                                  "before this item")
                continue
            try:
                out[i] = _run_limited(functools.partial(score_one, i), limit)
            except _Expired:
                why = "its share of reward.call_timeout_s" if by_share else "the per-item limit"
                out[i] = TimedOut(f"item took longer than {limit:.3g}s ({why})")
                if by_share:
                    cut.append(i)
        todo = cut
        if not todo:
            break
    return out
