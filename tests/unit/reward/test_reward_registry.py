"""Loading, naming and calling reward functions the TRL way; results and totals."""

from __future__ import annotations

import asyncio
import functools
import math
import sys
import types

import pytest

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.reward import registry as r
from agrpo.services.reward.results import Status, combine, per_item


def plain(completions, solution, **kwargs):
    """Plain reward."""
    return [1.0] * len(completions)


class Klass:
    def __call__(self, completions, level, hint="h", **kwargs):
        return [float(level)] * len(completions)


async def coro_fn(completions, **kwargs):
    return [2.0] * len(completions)


@pytest.fixture
def user_module(monkeypatch):
    mod = types.ModuleType("fake_user_rewards")
    mod.plain, mod.Klass, mod.instance, mod.coro_fn = plain, Klass, Klass(), coro_fn
    mod.not_callable = 3
    monkeypatch.setitem(sys.modules, "fake_user_rewards", mod)
    return mod


def test_callable_name_like_trl():
    assert r.callable_name(plain) == "plain"
    assert r.callable_name(functools.partial(functools.partial(plain, solution=1))) == "plain"
    assert r.callable_name(Klass()) == "Klass"


def test_load_user_functions(user_module):
    fn, info = r.load(r.FunctionSpec("fake_user_rewards:plain"))
    assert info.name == "plain" and info.required_columns == ("solution",) and not info.builtin
    assert info.description == "Plain reward."
    fn, info = r.load(r.FunctionSpec("fake_user_rewards:Klass", kwargs={}, alias="k"))
    assert isinstance(fn, Klass) and info.name == "k" and info.required_columns == ("level",)
    fn, info = r.load(r.FunctionSpec("fake_user_rewards:plain", kwargs={"solution": "x"}))
    assert isinstance(fn, functools.partial) and info.required_columns == ()
    for bad in ("fake_user_rewards:missing", "fake_user_rewards:not_callable", "no_colon",
                "nonexistent_pkg_zz:fn"):
        with pytest.raises(ValueError, match="reward function"):
            r.load(r.FunctionSpec(bad))


def test_builtins_load_with_params():
    _fn, info = r.load(r.FunctionSpec("builtin:cosine_scaled", kwargs={"max_len": 10}))
    assert info.name == "cosine_scaled_reward" and info.builtin and info.required_columns == ("solution",)
    with pytest.raises(ValueError, match="cosine_scaled"):
        r.load(r.FunctionSpec("builtin:cosine_scaled", kwargs={"bogus": 1}))


def test_invoke_sync_async_and_coercion(user_module):
    loop = asyncio.new_event_loop()
    try:
        assert r.invoke(coro_fn, {"completions": ["a", "b"]}, loop) == [2.0, 2.0]
        assert r.invoke(Klass(), {"completions": ["a"], "level": 3}, loop) == [3.0]
    finally:
        loop.close()
    assert r.coerce_output((1, None, True)) == [1.0, None, 1.0]

    class ArrayLike:
        def tolist(self):
            return [0.5]
    assert r.coerce_output(ArrayLike()) == [0.5]
    for bad in (None, 1.0, ["x"], [object()]):
        with pytest.raises(TypeError):
            r.coerce_output(bad)


def test_specs_from_config():
    cfg = AgrpoConfig.model_validate({
        "reward_funcs": [{"name": "accuracy_reward", "weight": 2.0}, {"name": "m:f", "alias": "a"}],
        "reward_weights": [0.25, 4.0]})
    specs = r.specs_from_config(cfg)
    assert [(s.source, s.weight, s.default_enabled) for s in specs[:2]] == [
        ("builtin:accuracy", 0.25, True), ("m:f", 4.0, True)]
    offered = {s.source for s in specs[2:]}
    assert offered == {"builtin:reasoning_accuracy", "builtin:think_format",
                       "builtin:repetition_penalty"}
    cfg.reward.offer_builtins = False
    assert len(r.specs_from_config(cfg)) == 2


def test_per_item_and_totals():
    late = per_item("timeout", None, "late", 2)
    assert [(s, reason) for s, _, reason in late] == [(Status.TIMEOUT, "late")] * 2
    assert [s for s, _, _ in per_item("failed", None, "boom", 2)] == [Status.FAILED] * 2
    wrong = per_item("ok", [1.0], "", 2)
    assert [s for s, _, _ in wrong] == [Status.FAILED] * 2 and "1 values for 2 items" in wrong[0][2]
    col_a = per_item("ok", [1.0, None, math.inf], "", 3)
    assert [s for s, _, _ in col_a] == [Status.OK, Status.NOT_APPLICABLE, Status.FAILED]
    col_b = per_item("ok", [0.5, 2.0, None], "", 3)
    items = combine(["a", "b"], [2.0, -1.0], [col_a, col_b])
    assert items[0].total == 2.0 * 1.0 - 0.5
    assert items[1].total == -2.0  # a not applicable: left out, as TRL's nansum
    assert math.isnan(items[2].total)  # nothing OK
    assert [s.name for s in items[0].scores] == ["a", "b"]
