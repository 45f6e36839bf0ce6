"""Environments: `environment_factory` (one callable, or name -> callable).

Each rollout borrows one instance from a per-environment pool (created on
demand, reused after release), calls `reset(**row)` (a returned string is
appended to the last user message), exposes the instance's public methods as
tools and, if the class defines `get_reward` (sync or async), scores the
finished rollout with it: one reward column named after the class.
With a dict, the dataset's `environment` column picks the environment and only
its tools are shown.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .tools import load_callable, tool_schema

RESERVED = {"reset", "get_reward"}
ENV_COLUMN = "environment"


def public_methods(instance: Any) -> dict[str, Callable]:
    """Bound public methods other than reset/get_reward: the environment's tools."""
    out: dict[str, Callable] = {}
    for name in dir(type(instance)):
        if name.startswith("_") or name in RESERVED:
            continue
        attr = getattr(instance, name, None)
        if inspect.ismethod(attr):
            out[name] = attr
    return out


@dataclass
class EnvSpec:
    """What probing one instance learned about an environment."""

    name: str
    factory: Callable
    class_name: str
    tool_names: list[str]
    schemas: list[dict]
    has_reward: bool
    pool: list[Any] = field(default_factory=list)
    created: int = 0


def probe(name: str, factory: Callable) -> EnvSpec:
    """Build one instance: reset is required; it seeds the pool."""
    inst = factory()
    if not callable(getattr(inst, "reset", None)):
        raise TypeError(f"environment {name!r} ({type(inst).__name__}) has no callable reset()")
    methods = public_methods(inst)
    schemas = [tool_schema(m) for m in methods.values()]
    spec = EnvSpec(name, factory, type(inst).__name__, list(methods), schemas,
                   callable(getattr(inst, "get_reward", None)))
    spec.pool.append(inst)
    spec.created = 1
    return spec


class Environments:
    """Pools of environment instances, chosen per row."""

    def __init__(self, factory: Callable | dict[str, Callable]) -> None:
        self.multi = isinstance(factory, dict)
        items = factory.items() if isinstance(factory, dict) else [("default", factory)]
        self.specs = {name: probe(name, f) for name, f in items}

    @classmethod
    def from_config(cls, value: str | dict[str, str]) -> Environments:
        if isinstance(value, dict):
            return cls({k: load_callable(v) for k, v in value.items()})
        return cls(load_callable(value))

    def spec_for(self, row: dict) -> EnvSpec:
        if not self.multi:
            return self.specs["default"]
        name = row.get(ENV_COLUMN)
        if name not in self.specs:
            raise ValueError(f"row's {ENV_COLUMN!r} is {name!r}; known: {sorted(self.specs)}")
        return self.specs[name]

    def acquire(self, spec: EnvSpec) -> Any:
        if spec.pool:
            return spec.pool.pop()
        spec.created += 1
        return spec.factory()

    def release(self, spec: EnvSpec, inst: Any) -> None:
        spec.pool.append(inst)


async def maybe_await(fn: Callable, *args, **kwargs) -> Any:
    """Call sync (in a thread) or async callables alike."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    out = await asyncio.to_thread(fn, *args, **kwargs)
    return await out if inspect.isawaitable(out) else out


def append_to_last_user(messages: list[dict], text: str | None) -> list[dict]:
    """A copy of the messages with text appended to the last user message."""
    msgs = [dict(m) for m in messages]
    if not text:
        return msgs
    for m in reversed(msgs):
        if m.get("role") == "user":
            m["content"] = f"{m.get('content') or ''}{text}"
            return msgs
    msgs.append({"role": "user", "content": text})
    return msgs


async def reset(inst: Any, row: dict) -> str | None:
    out = await maybe_await(inst.reset, **row)
    return out if isinstance(out, str) else None


async def env_reward(inst: Any) -> float:
    return float(await maybe_await(inst.get_reward))
