"""The version rules both trainer and rollout use (services/common/versions.py)."""

import pytest

from agrpo.services.common.versions import Lineage, label_to_version, oldest_version, sample_version, sample_versions


def test_label_to_version():
    assert label_to_version("default", 9) == 0
    assert label_to_version("12", 9) == 12
    assert label_to_version("step-1", 9) == 9
    assert label_to_version(None, 9) == 9 and label_to_version("", 9) == 9
    assert label_to_version("x") is None


def test_stale_is_strictly_more_than_max_staleness():
    is_stale = Lineage().stale  # the rule trainer and rollout use
    assert not is_stale(5, 3, 2)
    assert is_stale(6, 3, 2)
    assert not is_stale(3, 3, 0) and is_stale(4, 3, 0)


def test_oldest_version_ignores_unknown():
    assert oldest_version([4, None, 2, 3], 9) == 2
    assert oldest_version([None], 9) == 9
    assert oldest_version([], 7) == 7


def test_a_samples_version_is_the_oldest_it_names():
    assert sample_versions(5, [3, 5, 4]) == {3, 4, 5}
    assert sample_version(5, [3, 4]) == 3 and sample_version(2, [4]) == 2 and sample_version(7, []) == 7


@pytest.mark.parametrize("stated, spans", [(5, [3, 5]), (2, [4, 6]), (7, []), (0, [0])])
def test_rollout_and_trainer_agree_on_a_samples_version(stated, spans):
    """The version rollout puts on a sample is the one the trainer reads back from it, and the
    trainer finds no newer claim to refuse: both sides apply sample_version."""
    from types import SimpleNamespace

    from agrpo.services.rollout.samples import Row, ScoredGroup, build_samples
    from agrpo.services.trainer.servicer import sample_from_proto

    group = SimpleNamespace(key=(0, 0), group_id="g", request_id=lambda i: f"g-{i}")
    row = Row(0, [1, 2, 3, 4], [0, 0, 1, 1], [0.0, 0.0, -1.0, -1.0], 2,
              [(v, 2 + k % 2, 3 + k % 2) for k, v in enumerate(spans)], stated, 1.0)
    [sent] = build_samples(group, SimpleNamespace(prompt_text=""), [row], ScoredGroup([1.0], {}, 0.0, 0.0), ["x"],
                           send_text=False, producer_id="p", buffered=0)
    read = sample_from_proto(sent)
    assert sent.policy_version == read.policy_version == sample_version(stated, spans)
    assert read.sent_version is None


def test_lineage_after_resumes():
    from agrpo.services.common.versions import Lineage, lineage_from_proto, lineage_to_proto

    plain = Lineage()
    assert plain.distance(7, 5) == 2 and not plain.stale(7, 5, 2) and plain.stale(8, 5, 2)
    # Resumed from version 10 while 11-15 had been published: they leave the lineage.
    once = plain.resumed(10, 16)
    assert once.segments == ((0, 10, 0), (16, None, 10))
    assert once.index(12) is None and once.distance(17, 9) == 2 and once.distance(16, 10) == 0
    assert once.stale(16, 13, 100) and not once.on_lineage([9, 16, 12])
    # A second resume, from 17 after 18-29 were published; unpublished steps count as one ahead.
    twice = once.resumed(17, 30, ahead=1)
    assert twice.segments == ((0, 10, 0), (16, 17, 10), (30, None, 12))
    assert twice.index(18) is None and twice.distance(30, 10) == 2
    assert lineage_from_proto(lineage_to_proto(twice)) == twice and lineage_from_proto([]) == plain
