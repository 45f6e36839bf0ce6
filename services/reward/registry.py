"""Which reward functions a server offers, how they are loaded, named and called.

A `FunctionSpec` (picklable) says what to load; workers turn it into a callable with
`load()` and report a `FunctionInfo` back. Calls follow TRL's convention: keyword
arguments `prompts`, `completions`, `completion_ids` and one list per dataset column;
the function returns one float (or None: not applicable) per item, sync or async.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agrpo.services.common.imports import UserCodeNotFound, load_object

from . import builtins
from .results import TimedOut

RESERVED_ARGS = ("prompts", "completions", "completion_ids")


@dataclass(frozen=True)
class FunctionSpec:
    """What to load: `builtin:<key>` or `module:callable`, with parameters and weight."""

    source: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    alias: str | None = None
    weight: float = 1.0
    default_enabled: bool = True


@dataclass(frozen=True)
class FunctionInfo:
    """What a loaded function is, as ListRewardFunctions reports it."""

    name: str
    source: str
    description: str
    required_columns: tuple[str, ...]
    weight: float
    default_enabled: bool
    builtin: bool


def check_names(cfg: Any) -> None:
    """Every configured name is a built-in or a `module:callable` (one line naming the key)."""
    from agrpo.services.common.preflight import StartupError

    for i, fc in enumerate(cfg.reward_funcs):
        if ":" not in fc.name and builtins.builtin_key(fc.name) is None:
            raise StartupError(f"reward_funcs[{i}].name={fc.name[:80]!r}: not a built-in "
                               f"({', '.join(builtins.BUILTINS)}) nor a module:callable")


def specs_from_config(cfg: Any) -> list[FunctionSpec]:
    """The configured functions (default-enabled, weights from `reward_weights` when set),
    then, if `reward.offer_builtins`, every parameter-free built-in not configured."""
    specs = []
    weights = cfg.reward_weights or [f.weight for f in cfg.reward_funcs]
    for fc, weight in zip(cfg.reward_funcs, weights):
        key = builtins.builtin_key(fc.name)
        source = f"builtin:{key}" if key else fc.name
        specs.append(FunctionSpec(source, dict(fc.kwargs), fc.alias, float(weight), True))
    if cfg.reward.offer_builtins:
        taken = {s.source for s in specs}
        for key, entry in builtins.BUILTINS.items():
            if f"builtin:{key}" not in taken and not entry.needs_params:
                specs.append(FunctionSpec(f"builtin:{key}", default_enabled=False))
    return specs


def callable_name(fn: Any) -> str:
    """TRL's metric name: unwrap partials, then `__name__`, else the class name."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def _required_columns(fn: Any) -> tuple[str, ...]:
    """Parameters a user function needs beyond the reserved ones: dataset columns."""
    declared = getattr(fn, "required_columns", None)
    if declared is not None:
        return tuple(declared)
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty
                 and p.name not in RESERVED_ARGS)


def _description(fn: Any) -> str:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    doc = inspect.getdoc(inner) or inspect.getdoc(type(inner)) or ""
    return " ".join(doc.split("\n\n")[0].split())


def load(spec: FunctionSpec) -> tuple[Callable[..., Any], FunctionInfo]:
    """Build the callable for `spec`; ValueError naming the function when that fails."""
    try:
        if spec.source.startswith("builtin:"):
            fn = builtins.create(spec.source.removeprefix("builtin:"), spec.kwargs)
        else:
            fn = load_object(spec.source)
            if isinstance(fn, type):  # a class: its instance is the reward function
                fn = fn(**spec.kwargs)
            elif spec.kwargs:
                fn = functools.partial(fn, **spec.kwargs)
    except UserCodeNotFound as exc:
        raise ValueError(f"reward function {spec.source!r}: {exc}") from exc
    except Exception as exc:  # reported as a config error
        raise ValueError(f"reward function {spec.source!r}: {type(exc).__name__}: {exc}") from exc
    if not callable(fn):
        raise ValueError(f"reward function {spec.source!r} is a {type(fn).__name__}, not callable")
    info = FunctionInfo(
        name=spec.alias or callable_name(fn), source=spec.source, description=_description(fn),
        required_columns=_required_columns(fn), weight=spec.weight,
        default_enabled=spec.default_enabled, builtin=spec.source.startswith("builtin:"))
    return fn, info


def invoke(fn: Callable[..., Any], kwargs: dict[str, Any],
           loop: asyncio.AbstractEventLoop) -> list[float | TimedOut | None]:
    """Call `fn` the TRL way (awaiting it when async) and coerce its result to plain floats."""
    out = fn(**kwargs)
    if inspect.isawaitable(out):
        out = loop.run_until_complete(out)
    return coerce_output(out)


def coerce_output(out: Any) -> list[float | TimedOut | None]:
    """A list of float-or-None (or TimedOut, see deadline.py) from what a function returned;
    TypeError when it is not one."""
    if out is None:
        raise TypeError("returned None instead of a list (return [None] * n for 'not applicable')")
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
        out = out.tolist()  # numpy arrays, torch tensors
    if not isinstance(out, (list, tuple)):
        raise TypeError(f"returned a {type(out).__name__}, expected a list of floats")
    values: list[float | TimedOut | None] = []
    for i, value in enumerate(out):
        if value is None or isinstance(value, TimedOut):
            values.append(value)
            continue
        try:
            values.append(float(value))
        except OverflowError:  # an int beyond the double range: non-finite, so FAILED
            values.append(math.inf if value > 0 else -math.inf)
        except (TypeError, ValueError):
            raise TypeError(f"value {i} is a {type(value).__name__}, expected a number or None") from None
    return values
