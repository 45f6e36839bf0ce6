"""The version rules both trainer and rollout use (services/common/versions.py)."""

from services.common.versions import is_stale, label_to_version, oldest_version


def test_label_to_version():
    assert label_to_version("default", 9) == 0
    assert label_to_version("12", 9) == 12
    assert label_to_version("step-1", 9) == 9
    assert label_to_version(None, 9) == 9 and label_to_version("", 9) == 9
    assert label_to_version("x") is None


def test_is_stale_is_strictly_more_than_max_staleness():
    assert not is_stale(5, 3, 2)
    assert is_stale(6, 3, 2)
    assert not is_stale(3, 3, 0) and is_stale(4, 3, 0)


def test_oldest_version_ignores_unknown():
    assert oldest_version([4, None, 2, 3], 9) == 2
    assert oldest_version([None], 9) == 9
    assert oldest_version([], 7) == 7
