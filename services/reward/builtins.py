"""Built-in reward functions, equivalent to `trl.rewards`, with TRL's calling convention.

Each built-in is a picklable callable-class instance with a `__name__` equal to TRL's
metric name (`accuracy_reward`, ...), so `rewards/<name>` logs line up with TRL.

Differences from TRL, on purpose:
- Completions may be plain strings (standard format) as well as message lists
  (conversational; the first message's content is scored, as TRL does).
- Time limits are per item. math-verify's own timeouts are signal based, only work in a
  main thread, and end in a silent 0.0 (a wrong answer, as far as the caller can tell).
  TRL calls reward functions from `asyncio.to_thread`, so it turns them off and a
  pathological answer can hang scoring. Our workers call functions in their main
  thread, where `deadline.score_each` gives each item `item_timeout_s` (and a fair
  share of the call's budget): an item past it is TIMEOUT, the others keep their
  scores. In any other thread there are no limits, as in TRL.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agrpo.services.common.timeouts import ITEM_TIMEOUT_S

from .deadline import score_each
from .results import TimedOut

Completion = str | list[dict[str, Any]]


def completion_text(completion: Completion) -> str:
    """The text to score: a standard completion itself, else the first message's content."""
    if isinstance(completion, str):
        return completion
    if not completion:
        return ""
    return completion[0].get("content") or ""


class Accuracy:
    """1.0 if the completion's answer (boxed first) equals the solution, else 0.0;
    None when the solution itself cannot be parsed; TIMEOUT for an item that takes
    longer than `item_timeout_s` to parse and verify."""

    __name__ = "accuracy_reward"
    required_columns = ("solution",)

    def __init__(self, item_timeout_s: float | None = ITEM_TIMEOUT_S) -> None:
        if item_timeout_s is not None and item_timeout_s <= 0:
            raise ValueError(f"accuracy: item_timeout_s must be positive, got {item_timeout_s}")
        self.item_timeout_s = item_timeout_s
        # Our timers replace math-verify's, so its "timeout is disabled" warning is noise.
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.ERROR)

    def score_text(self, text: str, solution: str) -> float | None:
        """One verdict, without a time limit (the caller sets it); shared by the
        reasoning and cosine variants."""
        from latex2sympy2_extended import NormalizationConfig
        from math_verify import LatexExtractionConfig, parse, verify

        gold = parse(solution, parsing_timeout=None)
        if not gold:
            return None
        # The answer must be well-formed LaTeX; \boxed{} is tried before anything else.
        answer = parse(
            text,
            extraction_config=[LatexExtractionConfig(
                normalization_config=NormalizationConfig(units=True),
                boxed_match_priority=0,
                try_extract_without_anchor=False)],
            extraction_mode="first_match",
            parsing_timeout=None,
        )
        return float(verify(gold, answer, timeout_seconds=None))

    def __call__(self, completions: Sequence[Completion], solution: Sequence[str],
                 **kwargs: Any) -> list[float | TimedOut | None]:
        _same_length(completions, solution)
        return score_each(len(completions), lambda i: self.score_text(
            completion_text(completions[i]), str(solution[i])), self.item_timeout_s)


class ReasoningAccuracy(Accuracy):
    """Accuracy of the text after the reasoning delimiter (`</think>`); 0.0 when the
    reasoning never ends (penalised rather than skipped)."""

    __name__ = "reasoning_accuracy_reward"

    def __init__(self, reasoning_delimiters: Sequence[str] | None = None,
                 item_timeout_s: float | None = ITEM_TIMEOUT_S) -> None:
        super().__init__(item_timeout_s)
        self.reasoning_delimiters = list(reasoning_delimiters or ["</think>"])

    def _one(self, completion: Completion, solution: str) -> float | None:
        text = completion_text(completion)
        delim = next((d for d in self.reasoning_delimiters if d in text), None)
        return 0.0 if delim is None else self.score_text(text.split(delim)[-1], solution)

    def __call__(self, completions: Sequence[Completion], solution: Sequence[str],
                 **kwargs: Any) -> list[float | TimedOut | None]:
        _same_length(completions, solution)
        return score_each(len(completions), lambda i: self._one(completions[i], str(solution[i])),
                          self.item_timeout_s)


_THINK = re.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", re.DOTALL | re.MULTILINE)


class ThinkFormat:
    """1.0 if the completion opens with one `<think>...</think>` block, else 0.0."""

    __name__ = "think_format_reward"
    required_columns = ()

    def __call__(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        return [1.0 if _THINK.match(completion_text(c)) else 0.0 for c in completions]


class CosineScaled:
    """Correctness scaled by length on a cosine schedule (Demystifying Long CoT, App. C.1):

        r = v_min + (v_max - v_min) * (1 + cos(pi * min(len/max_len, 1))) / 2

    with (v_min, v_max) = (min_value_correct, max_value_correct) when correct (short is
    better) and (max_value_wrong, min_value_wrong) when wrong (short is punished more).
    None when the solution cannot be parsed; TIMEOUT when the verdict timed out."""

    __name__ = "cosine_scaled_reward"
    required_columns = ("solution",)

    def __init__(self, max_len: int, min_value_wrong: float = -1.0, max_value_wrong: float = -0.5,
                 min_value_correct: float = 0.5, max_value_correct: float = 1.0,
                 item_timeout_s: float | None = ITEM_TIMEOUT_S) -> None:
        if max_len <= 0:
            raise ValueError(f"cosine_scaled: max_len must be positive, got {max_len}")
        self.max_len = max_len
        self.correct = (min_value_correct, max_value_correct)
        self.wrong = (max_value_wrong, min_value_wrong)
        self.accuracy = Accuracy(item_timeout_s)

    def __call__(self, completions: Sequence[Completion], solution: Sequence[str],
                 completion_ids: Sequence[Sequence[int]], **kwargs: Any) -> list[float | TimedOut | None]:
        verdicts = self.accuracy(completions, solution)
        _same_length(verdicts, completion_ids)
        out: list[float | TimedOut | None] = []
        for correct, ids in zip(verdicts, completion_ids):
            if correct is None or isinstance(correct, TimedOut):
                out.append(correct)
                continue
            lo, hi = self.correct if correct else self.wrong
            # Clamped: cos is periodic, so past max_len the schedule would climb back.
            progress = min(len(ids) / self.max_len, 1.0)
            out.append(float(lo + 0.5 * (hi - lo) * (1.0 + math.cos(progress * math.pi))))
        return out


class RepetitionPenalty:
    """(1 - unique/total token n-grams) * max_penalty; 0.0 below ngram_size tokens."""

    __name__ = "repetition_penalty_reward"
    required_columns = ()

    def __init__(self, ngram_size: int = 3, max_penalty: float = -1.0) -> None:
        if ngram_size <= 0:
            raise ValueError(f"repetition_penalty: ngram_size must be > 0, got {ngram_size}")
        if max_penalty > 0:
            raise ValueError(f"repetition_penalty: max_penalty must be <= 0, got {max_penalty}")
        self.ngram_size = ngram_size
        self.max_penalty = max_penalty

    def __call__(self, completion_ids: Sequence[Sequence[int]], **kwargs: Any) -> list[float]:
        out = []
        n = self.ngram_size
        for completion in completion_ids:
            ids = list(completion)
            if len(ids) < n:
                out.append(0.0)
                continue
            ngrams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
            repeated = 1.0 - len(set(ngrams)) / len(ngrams)
            out.append(repeated * self.max_penalty if repeated else 0.0)
        return out


class SoftOverlongPunishment:
    """DAPO eq. 13: 0 up to L_max - L_cache tokens, then linear down to -1 at L_max,
    -1 beyond it."""

    __name__ = "soft_overlong_punishment_reward"
    required_columns = ()

    def __init__(self, max_completion_len: int, soft_punish_cache: int) -> None:
        if soft_punish_cache < 0 or max_completion_len <= 0:
            raise ValueError("soft_overlong_punishment: need max_completion_len > 0 and "
                             "soft_punish_cache >= 0")
        self.max_completion_len = max_completion_len
        self.soft_punish_cache = soft_punish_cache

    def __call__(self, completion_ids: Sequence[Sequence[int]], **kwargs: Any) -> list[float]:
        limit, cache = self.max_completion_len, self.soft_punish_cache
        out = []
        for ids in completion_ids:
            length = len(ids)
            if length <= limit - cache:
                out.append(0.0)
            elif length <= limit:
                out.append((limit - cache - length) / cache)
            else:
                out.append(-1.0)
        return out


def _same_length(a: Sequence[Any], b: Sequence[Any]) -> None:
    if len(a) != len(b):
        raise ValueError(f"got {len(a)} completions but {len(b)} values to compare with")


@dataclass(frozen=True)
class Builtin:
    """A built-in: its factory and whether it can be offered without parameters."""

    factory: Callable[..., Any]
    needs_params: bool = False


BUILTINS: dict[str, Builtin] = {
    "accuracy": Builtin(Accuracy),
    "reasoning_accuracy": Builtin(ReasoningAccuracy),
    "think_format": Builtin(ThinkFormat),
    "cosine_scaled": Builtin(CosineScaled, needs_params=True),
    "repetition_penalty": Builtin(RepetitionPenalty),
    "soft_overlong_punishment": Builtin(SoftOverlongPunishment, needs_params=True),
}

# Names a TRL user would write: the function or factory names in trl.rewards.
_TRL_NAMES = {
    "accuracy_reward": "accuracy",
    "reasoning_accuracy_reward": "reasoning_accuracy",
    "think_format_reward": "think_format",
    "get_cosine_scaled_reward": "cosine_scaled",
    "cosine_scaled_reward": "cosine_scaled",
    "get_repetition_penalty_reward": "repetition_penalty",
    "repetition_penalty_reward": "repetition_penalty",
    "get_soft_overlong_punishment": "soft_overlong_punishment",
    "soft_overlong_punishment_reward": "soft_overlong_punishment",
}


def builtin_key(name: str) -> str | None:
    """The built-in a configured name means (`accuracy`, `accuracy_reward`,
    `trl.rewards:accuracy_reward`, `builtin:accuracy`), or None for a user function."""
    for prefix in ("builtin:", "trl.rewards:", "trl.rewards."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name in BUILTINS:
        return name
    return _TRL_NAMES.get(name)


def create(key: str, kwargs: dict[str, Any]) -> Any:
    """Instantiate built-in `key` with its parameters; TypeError/ValueError on bad ones."""
    return BUILTINS[key].factory(**kwargs)
