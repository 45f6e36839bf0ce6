"""`trl.rewards` under TRL's names and signatures, so a ported script needs no TRL:

    from agrpo.rewards import accuracy_reward, get_soft_overlong_punishment

Each one calls our built-in (agrpo/services/reward/builtins.py). Passed to
`AsyncGRPOTrainer(reward_funcs=...)`, it is configured as that built-in by name (with the
factory's arguments), so the reward service runs the built-in in its workers, under its
deadlines: no pickle, no import of this module there. Called directly, it scores in
this process, as TRL's function would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agrpo.services.reward import builtins

__all__ = ["accuracy_reward", "get_cosine_scaled_reward", "get_repetition_penalty_reward",
           "get_soft_overlong_punishment", "reasoning_accuracy_reward", "think_format_reward"]

BUILTIN_ATTR = "__agrpo_builtin__"
"""Set on every function here: (built-in key, its arguments), what the Python API configures."""


def _scores(values: list) -> list[float | None]:
    """A verdict that ran out of time scores None here (TRL has no per-item time limit)."""
    return [v if v is None or isinstance(v, float) else None for v in values]


def accuracy_reward(completions: list[list[dict[str, str]]], solution: list[str],
                    log_extra: Callable[[str, list], None] | None = None, **kwargs) -> list[float | None]:
    """1.0 when the completion's answer equals the solution (math-verify), else 0.0; None when
    the solution cannot be parsed. `log_extra` is accepted for TRL's signature and not called."""
    return _scores(builtins.create("accuracy", {})(completions, solution))


def reasoning_accuracy_reward(completions: list[list[dict[str, str]]], solution: list[str],
                              reasoning_delimiters: list[str] | None = None,
                              log_extra: Callable[[str, list], None] | None = None,
                              **kwargs) -> list[float | None]:
    """Accuracy of the text after the reasoning delimiter (`</think>`); 0.0 when it never ends."""
    fn = builtins.create("reasoning_accuracy", {"reasoning_delimiters": reasoning_delimiters})
    return _scores(fn(completions, solution))


def think_format_reward(completions: list[list[dict[str, str]]], **kwargs) -> list[float]:
    """1.0 when the completion opens with one `<think>...</think>` block, else 0.0."""
    return builtins.create("think_format", {})(completions)


def _factory_result(key: str, params: dict[str, Any]) -> Callable:
    fn = builtins.create(key, params)  # validates the arguments now, as TRL's factory would

    def reward(completions: Sequence[Any] | None = None, completion_ids: Sequence[Sequence[int]] | None = None,
               **kwargs) -> list[float | None]:
        if completion_ids is None:
            raise ValueError(f"{fn.__name__} needs completion_ids (the reward service passes them)")
        args = {"completion_ids": completion_ids, **kwargs}
        if completions is not None:
            args["completions"] = completions
        return _scores(fn(**args))

    reward.__name__ = reward.__qualname__ = fn.__name__
    setattr(reward, BUILTIN_ATTR, (key, params))
    return reward


def get_cosine_scaled_reward(max_len: int, min_value_wrong: float = -1.0, max_value_wrong: float = -0.5,
                             min_value_correct: float = 0.5, max_value_correct: float = 1.0) -> Callable:
    """Correctness scaled by completion length on a cosine schedule (short correct answers best)."""
    return _factory_result("cosine_scaled", {
        "max_len": max_len, "min_value_wrong": min_value_wrong, "max_value_wrong": max_value_wrong,
        "min_value_correct": min_value_correct, "max_value_correct": max_value_correct})


def get_repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = -1.0) -> Callable:
    """Penalty for repeated n-grams of completion tokens, down to `max_penalty`."""
    return _factory_result("repetition_penalty", {"ngram_size": ngram_size, "max_penalty": max_penalty})


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> Callable:
    """DAPO's soft overlong punishment: 0 up to max_completion_len - soft_punish_cache tokens,
    then down to -1 at max_completion_len."""
    return _factory_result("soft_overlong_punishment", {"max_completion_len": max_completion_len,
                                                        "soft_punish_cache": soft_punish_cache})


for _fn, _key in ((accuracy_reward, "accuracy"), (reasoning_accuracy_reward, "reasoning_accuracy"),
                  (think_format_reward, "think_format")):
    setattr(_fn, BUILTIN_ATTR, (_key, {}))


def builtin_entry(fn: Any) -> dict | None:
    """The reward_funcs entry of one of these functions ({name, kwargs}), or None for any other."""
    marked = getattr(fn, BUILTIN_ATTR, None)
    if marked is None:
        return None
    key, params = marked
    return {"name": key, **({"kwargs": dict(params)} if params else {})}
