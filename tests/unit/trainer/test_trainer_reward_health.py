"""Broken rewards: a warning naming the function, then a stop after `patience` steps."""

import math

import pytest

from agrpo.services.common.preflight import StartupError
from agrpo.services.trainer.reward_health import RewardHealth


def _samples(make_sample, n, bad):
    out = []
    for i in range(n):
        s = make_sample(f"s{i}", "g", [1], [2])
        if i < bad:
            s.reward, s.reward_components = math.nan, {"mine": math.nan}
            s.reward_errors = {"mine": "ZeroDivisionError: division by zero"}
        else:
            s.reward, s.reward_components = 1.0, {"mine": 1.0}
        out.append(s)
    return out


def test_warns_then_stops_after_patience(make_sample):
    health = RewardHealth(patience=2)
    warnings = health.check(_samples(make_sample, 4, 3))
    assert warnings == [("reward function 'mine' failed or returned None for 3/4 samples; "
                         "last error: ZeroDivisionError: division by zero")]
    with pytest.raises(StartupError, match=r"2 consecutive steps.*'mine'.*ZeroDivisionError"):
        health.check(_samples(make_sample, 4, 4))


def test_a_good_step_resets_and_zero_never_stops(make_sample):
    health = RewardHealth(patience=2)
    health.check(_samples(make_sample, 4, 4))
    assert health.check(_samples(make_sample, 4, 0)) == [] and health.bad_steps == 0
    never = RewardHealth(patience=0)
    for _ in range(5):
        never.check(_samples(make_sample, 2, 2))
    assert never.bad_steps == 5
