"""Exactly once per prompt key: the first group in a batch owns the key."""

from agrpo.services.trainer.ledger import Ledger
from agrpo.services.trainer.sample import Sample


def _sample(sid: str, group: str, key=(3, 0)) -> Sample:
    return Sample(sample_id=sid, group_id=group, prompt_key=key, policy_version=1,
                  input_ids=[1, 2, 3], completion_mask=[0, 1, 1], behavior_logprobs=[0, -1, -1],
                  advantage=0.5)


def test_first_group_owns_the_key_and_others_are_refused():
    ledger = Ledger(prompts_per_epoch=4)
    assert ledger.claim(_sample("a1", "g1"))
    assert ledger.claim(_sample("a2", "g1"))
    assert not ledger.claim(_sample("b1", "g2"))
    assert ledger.owned_by_other(_sample("b2", "g2"))
    assert not ledger.owned_by_other(_sample("c1", "g3", key=(4, 0)))


def test_ownership_survives_a_checkpoint_round_trip():
    ledger = Ledger(prompts_per_epoch=4)
    ledger.record([_sample("a1", "g1")])
    back = Ledger.from_dict(ledger.to_dict())
    assert back.owned_by_other(_sample("b1", "g2"))
    assert not back.owned_by_other(_sample("a2", "g1"))
    assert back.prompts_trained == 1 and back.is_trained("a1")


def test_same_key_in_another_epoch_is_a_different_prompt():
    ledger = Ledger(prompts_per_epoch=4)
    ledger.record([_sample("a1", "g1", key=(3, 0))])
    assert ledger.claim(_sample("b1", "g2", key=(3, 1)))


def test_batchers_evict_samples_that_went_stale_in_open_rows():
    from agrpo.services.common.versions import Lineage

    is_stale = Lineage().stale
    from agrpo.services.trainer.packing import FixedCountBatcher, TokenBudgetBatcher

    old, fresh = _sample("o1", "g1"), _sample("f1", "g2", key=(5, 0))
    fresh.policy_version = 3
    for batcher in (TokenBudgetBatcher(num_rows=1, budget=64), FixedCountBatcher(num_rows=1, batch_size=8)):
        assert batcher.add(old) == [] and batcher.add(fresh) == []
        evicted = batcher.evict(lambda s: is_stale(4, s.policy_version, max_staleness=2))
        assert [s.sample_id for s in evicted] == ["o1"]
        assert batcher.num_samples == 1
        closed = batcher.flush()
        assert [s.sample_id for s in closed.samples] == ["f1"]


def test_released_claim_lets_the_reissue_own_the_key():
    ledger = Ledger(prompts_per_epoch=4)
    first = _sample("a1", "g1")
    assert ledger.claim(first)
    ledger.release([first])  # evicted as stale, never trained
    assert ledger.claim(_sample("b1", "g2"))
    trained = _sample("c1", "g3", key=(9, 0))
    ledger.record([trained])
    ledger.release([trained])  # trained keys stay owned
    assert ledger.owned_by_other(_sample("d1", "g4", key=(9, 0)))


def test_step_metrics_average_what_rollout_measured():
    from agrpo.services.trainer.step_metrics import _sample_metrics

    a, b = _sample("a", "g"), _sample("b", "g")
    a.metrics = {"tools/call_frequency": 1.0, "generation_tok_per_s": 100.0}
    b.metrics = {"tools/call_frequency": 0.0}
    out = {"reward": 0.5}
    _sample_metrics(out, [a, b])
    assert out["tools/call_frequency"] == 0.5 and out["generation_tok_per_s"] == 100.0
    assert out["reward"] == 0.5
