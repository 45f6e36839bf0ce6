"""GRPO loss pure functions: chunked logprobs, clipped surrogate, normalisation, TIS."""

from __future__ import annotations

import math

import pytest
import torch

from agrpo.services.trainer.loss import (
    LossConfig,
    chunked_logprobs,
    normalised_loss,
    per_term_loss,
    policy_stats,
    segment_sums,
)


def test_chunked_logprobs_equal_full_softmax():
    torch.manual_seed(0)
    h = torch.randn(7, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (7,))
    logp, ent = chunked_logprobs(h, w, labels, temperature=0.7, chunk_size=8)
    full = torch.log_softmax((h @ w.T) / 0.7, -1)
    ref = full.gather(1, labels[:, None])[:, 0]
    assert torch.allclose(logp.double(), ref, atol=1e-5)
    p = full.exp()
    assert torch.allclose(ent.double(), -(p * full).sum(-1), atol=1e-4)  # fp32 accumulation
    # Gradients match the unchunked computation too.
    g1 = torch.autograd.grad(logp.sum(), (h, w))
    g2 = torch.autograd.grad(ref.sum(), (h, w))
    for a, b in zip(g1, g2):
        assert torch.allclose(a.double(), b, atol=1e-4)


def test_surrogate_on_policy_equals_minus_advantage():
    cfg = LossConfig(0.2, 0.2)
    logp = torch.tensor([-1.0, -2.0])
    per, ratio = per_term_loss(logp, logp.clone(), torch.tensor([1.0, -1.0]), cfg)
    assert torch.allclose(ratio, torch.ones(2))
    assert torch.allclose(per, torch.tensor([-1.0, 1.0]))


@pytest.mark.parametrize("log_ratio,adv,expected_ratio_used", [
    (math.log(1.5), 1.0, 1.2),    # positive advantage: clipped at 1 + eps_high
    (math.log(0.5), -1.0, 0.8),   # negative advantage: clipped at 1 - eps
    (math.log(0.5), 1.0, 0.5),    # pessimistic bound keeps the unclipped value
    (math.log(1.5), -1.0, 1.5),
])
def test_clipping_cases(log_ratio, adv, expected_ratio_used):
    cfg = LossConfig(0.2, 0.2)
    per, _ = per_term_loss(torch.tensor([log_ratio]), torch.tensor([0.0]), torch.tensor([adv]), cfg)
    assert per.item() == pytest.approx(-expected_ratio_used * adv, rel=1e-5)


def test_epsilon_high_is_asymmetric():
    per, _ = per_term_loss(torch.tensor([math.log(1.5)]), torch.tensor([0.0]), torch.tensor([1.0]),
                           LossConfig(0.2, 0.28))
    assert per.item() == pytest.approx(-1.28, rel=1e-5)


def test_clipped_term_has_no_gradient():
    logp = torch.tensor([math.log(2.0)], requires_grad=True)
    per, _ = per_term_loss(logp, torch.tensor([0.0]), torch.tensor([1.0]), LossConfig(0.2, 0.2))
    per.sum().backward()
    assert logp.grad.item() == 0.0


def test_a_rows_share_is_its_sum_over_the_steps_terms_per_rank():
    per = torch.ones(6)
    assert normalised_loss(per, step_terms=12, world_size=2).item() == pytest.approx(6 / 6)
    assert normalised_loss(torch.zeros(0), step_terms=0).item() == 0.0  # max(.., 1) guards empty


def test_tis_weights_are_truncated():
    cfg = LossConfig(0.2, 0.2, tis_cap=2.0)
    logp = torch.tensor([0.0, 0.0], requires_grad=True)
    old = torch.tensor([math.log(0.25), math.log(2.0)])  # trainer/vLLM ratios 4 (capped to 2) and 0.5
    per, _ratio = per_term_loss(logp, old, torch.tensor([1.0, 1.0]), cfg)
    assert torch.allclose(per, torch.tensor([-2.0, -0.5]))
    per.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([-2.0, -0.5]))


def test_policy_stats_clip_fractions():
    cfg = LossConfig(0.2, 0.2)
    logp = torch.log(torch.tensor([0.5, 1.5, 1.0, 1.0]))
    stats = policy_stats(logp, torch.zeros(4), torch.tensor([-1.0, 1.0, 1.0, -1.0]), torch.ones(4),
                         torch.tensor([0, 0, 1, 1]), cfg)
    assert stats["clip_ratio/low_mean"] == (1.0, 4.0)
    assert stats["clip_ratio/high_mean"] == (1.0, 4.0)
    assert stats["clip_ratio/region_mean"] == (2.0, 4.0)
    assert stats["clip_ratio/low_min"] == 0.0 and stats["clip_ratio/high_max"] == 0.5
    assert stats["kl"][0] > 0 and stats["entropy"] == (4.0, 4.0)


def test_segment_sums_give_each_id_its_sum_and_ids_without_terms_zero():
    sums = segment_sums(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0, 0, 2, 2]))
    assert sums[:3].tolist() == [3.0, 0.0, 7.0] and not sums[3:].any()


def test_clip_extrema_leave_out_segment_ids_without_terms():
    cfg = LossConfig(0.2, 0.2)
    logp = torch.log(torch.tensor([0.5, 0.5, 0.5, 1.5]))  # low-clipped: all of segment 0, half of 2
    stats = policy_stats(logp, torch.zeros(4), torch.tensor([-1.0, -1.0, -1.0, 1.0]), torch.ones(4),
                         torch.tensor([0, 0, 2, 2]), cfg)
    assert stats["clip_ratio/low_min"] == 0.5  # segment 2's share, not id 1's (it has no terms)
    assert stats["clip_ratio/high_max"] == 0.5


@pytest.mark.parametrize("mode,lo,hi,expected", [
    # trainer/vLLM ratios per term: 4, 0.5, 1.0 (sequence 0 = terms 0-1, sequence 1 = term 2)
    ("token_truncate", None, 2.0, [2.0, 0.5, 1.0]),
    ("token_truncate", 0.6, 2.0, [2.0, 0.6, 1.0]),
    ("token_mask", None, 2.0, [0.0, 0.5, 1.0]),
    ("token_mask", 0.6, None, [4.0, 0.0, 1.0]),
    ("sequence_truncate", None, 1.5, [1.5, 1.5, 1.0]),   # sequence ratio 4 * 0.5 = 2
    ("sequence_mask", None, 1.5, [0.0, 0.0, 1.0]),
    ("sequence_mask", None, 3.0, [2.0, 2.0, 1.0]),
])
def test_importance_sampling_modes(mode, lo, hi, expected):
    cfg = LossConfig(0.2, 0.2, is_mode=mode, is_min=lo, is_max=hi)
    logp = torch.zeros(3, requires_grad=True)
    old = torch.log(torch.tensor([0.25, 2.0, 1.0]))
    per, _ = per_term_loss(logp, old, torch.ones(3), cfg, segment=torch.tensor([0, 0, 1]))
    assert torch.allclose(per, -torch.tensor(expected), atol=1e-6)
    per.sum().backward()  # the surrogate is against the trainer's own logprob: never clipped
    assert torch.allclose(logp.grad, -torch.tensor(expected), atol=1e-6)


def test_tis_cap_is_token_truncate():
    cfg = LossConfig(0.2, 0.2, tis_cap=2.0)
    assert (cfg.is_mode, cfg.is_max) == ("token_truncate", 2.0)
    with pytest.raises(ValueError, match="importance sampling mode"):
        LossConfig(is_mode="bogus")


def test_mismatch_stats_by_staleness_and_masked_share():
    cfg = LossConfig(0.2, 0.2, is_mode="token_mask", is_max=2.0)
    logp = torch.zeros(4)
    old = torch.log(torch.tensor([0.25, 1.0, 1.0, 0.5]))  # ratios 4 (masked), 1, 1, 2
    stats = policy_stats(logp, old, torch.ones(4), torch.ones(4), torch.tensor([0, 0, 1, 1]), cfg,
                         staleness=torch.tensor([2, 2, 0, 0]))
    k3 = lambda r: (r - 1) - math.log(r)  # noqa: E731
    assert stats["mismatch/k3_kl_mean/staleness_0"] == pytest.approx((k3(2.0), 2.0))
    assert stats["mismatch/k3_kl_mean/staleness_2"] == pytest.approx((k3(4.0), 2.0))
    assert stats["mismatch/k3_kl_max"] == pytest.approx(k3(4.0))
    assert stats["mismatch/masked_share"] == (1.0, 4.0)
    assert stats["sampling/importance_sampling_ratio/max"] == pytest.approx(2.0)
    assert stats["clip_ratio/region_mean"] == (0.0, 4.0)  # corrected: the surrogate starts at 1


def test_stats_stay_on_the_device_until_read_once():
    from agrpo.services.trainer.engine import _merge, _reduce
    from agrpo.services.trainer.loss import materialize, policy_stat_tensors

    cfg = LossConfig(0.2, 0.2, is_mode="token_mask", is_max=2.0)
    args = (torch.zeros(4), torch.log(torch.tensor([0.25, 1.0, 1.0, 0.5])), torch.tensor([1.0, -1.0, 1.0, -1.0]),
            torch.ones(4), torch.tensor([0, 0, 1, 1]), cfg, torch.tensor([2, 2, 0, 0]))
    lazy = policy_stat_tensors(*args, stale_levels=[0, 2])
    assert all(isinstance(v[0] if isinstance(v, tuple) else v, torch.Tensor) for v in lazy.values())
    read, eager = materialize(lazy), policy_stats(*args)
    assert read.keys() == eager.keys()
    for key, value in eager.items():
        assert read[key] == pytest.approx(value), key
    acc: dict = {}
    _merge(acc, lazy)
    _merge(acc, policy_stat_tensors(torch.log(torch.tensor([3.0])), torch.zeros(1), torch.ones(1), torch.ones(1),
                                    torch.tensor([0]), cfg))
    merged = _reduce(materialize(acc))
    assert merged["mismatch/k3_kl_max"] == pytest.approx(max((4 - 1) - math.log(4), (3 - 1) - math.log(3)))
    assert merged["sampling/importance_sampling_ratio/min"] == 0.0  # the masked term of the first row
    assert merged["entropy"] == pytest.approx(1.0) and merged["ratio"] == pytest.approx((4 + 1 + 1 + 2 + 3) / 5)
