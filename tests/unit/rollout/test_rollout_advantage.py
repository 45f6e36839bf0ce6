import math

import pytest

from agrpo.services.rollout.advantage import group_advantages, group_stats


def test_population_std_and_formula():
    r = [1.0, 2.0, 3.0, 6.0]
    mean = 3.0
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / 4)  # population
    assert group_stats(r) == pytest.approx((mean, std))
    assert group_advantages(r) == pytest.approx([(x - mean) / (std + 1e-8) for x in r])


def test_equal_rewards_give_zero_advantage():
    assert group_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]


def test_nan_and_none_are_ignored_and_get_zero():
    adv = group_advantages([1.0, math.nan, 3.0, None])
    assert adv[1] == 0.0 and adv[3] == 0.0
    assert adv[0] == pytest.approx(-1.0 / (1.0 + 1e-8)) and adv[2] == pytest.approx(1.0 / (1.0 + 1e-8))


def test_all_nan_group_has_zero_advantage():
    assert group_advantages([math.nan, None, math.nan]) == [0.0, 0.0, 0.0]
    mean, std = group_stats([math.nan])
    assert math.isnan(mean) and math.isnan(std)
