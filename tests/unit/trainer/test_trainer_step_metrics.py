"""Step metrics: TRL's collator numbers over the step's micro-batches, reward stats per group."""

import math
from collections import Counter
from types import SimpleNamespace

from agrpo.services.trainer.ledger import Ledger
from agrpo.services.trainer.packing import TokenBudgetBatcher, iter_batches
from agrpo.services.trainer.step_metrics import FlopModel, step_metrics


def test_collator_and_reward_metrics(make_groups):
    samples = make_groups(n_groups=2, size=4, prompt_len=8, seed=3)
    for i, s in enumerate(samples):
        s.reward_components = {"acc": float(i % 2)}
        s.reward = 1.0 if s.group_id == "g0" else float(i % 2)  # g0 all equal: zero std
    batches = list(iter_batches(TokenBudgetBatcher(1, budget=64), samples))
    step_in = SimpleNamespace(batches=batches, wait_s=0.0, stale=[], staleness=[0] * len(samples))
    out = step_metrics(step_in, {"perf/step_s": 1.0}, version=1, ledger=Ledger(), drops=Counter(),
                       flops=FlopModel(10, 4, 1), peak_tflops=None, last_sync={}, token_budget=64)
    forwarded = sum(len(s) for s in samples)
    unique = sum(len(r.input_ids) for mb in batches for r in mb.rows)
    assert len(batches) == 1 and math.isclose(out["batch/packing_ratio"], forwarded / unique)
    assert out["batch/packing_ratio"] > 1  # the shared prompts are forwarded once
    assert math.isclose(out["batch/row_fill_frac"], unique / 64)
    assert math.isclose(out["sample/trained_tokens_mean"], sum(s.completion_length for s in samples) / 8)
    assert out["rewards/acc/mean"] == 0.5 and out["rewards/acc/std"] == 0.5
    assert out["frac_reward_zero_std"] == 0.5 and "rewards/acc" not in out


def test_infinite_rewards_do_not_break_the_step_log(make_groups):
    # The reward service may total a group to +-inf; statistics.pstdev raises on infinities.
    samples = make_groups(n_groups=1, size=4, prompt_len=8, seed=4)
    for s, r in zip(samples, (math.inf, -math.inf, 1.0, math.nan)):
        s.reward, s.reward_components = r, {"f": r}
    batches = list(iter_batches(TokenBudgetBatcher(1, budget=64), samples))
    step_in = SimpleNamespace(batches=batches, wait_s=0.0, stale=[], staleness=[0] * len(samples))
    out = step_metrics(step_in, {"perf/step_s": 1.0}, version=1, ledger=Ledger(), drops=Counter(),
                       flops=FlopModel(10, 4, 1), peak_tflops=None, last_sync={}, token_budget=64)
    assert math.isnan(out["rewards/f/std"]) and out["frac_reward_zero_std"] == 0.0
    for s, v in zip(samples, (1e308, 1e308, -math.inf, math.inf)):
        s.metrics = {"generation_tok_per_s": v}
    out = step_metrics(step_in, {"perf/step_s": 1.0}, version=1, ledger=Ledger(), drops=Counter(),
                       flops=FlopModel(10, 4, 1), peak_tflops=None, last_sync={}, token_budget=64)
    assert math.isnan(out["generation_tok_per_s"])


def test_mfu_counts_what_was_computed_and_hfu_the_recompute_too(make_groups):
    samples = make_groups(n_groups=2, size=4, prompt_len=8, seed=3)
    batches = list(iter_batches(TokenBudgetBatcher(1, budget=64), samples))
    step_in = SimpleNamespace(batches=batches, wait_s=0.0, stale=[], staleness=[0] * len(samples))
    unique, load = batches[0].num_forward_tokens, sum(batches[0].load)
    flops = FlopModel(matmul_params=1000, hidden_size=16, num_layers=2, tree=True, recompute=True)
    out = step_metrics(step_in, {"perf/step_s": 2.0}, version=1, ledger=Ledger(), drops=Counter(),
                       flops=flops, peak_tflops=1e-9, last_sync={}, token_budget=64)
    forward = 2 * 1000 * unique + 4 * 16 * 2 * load
    assert math.isclose(out["perf/mfu"], 3 * forward / 2.0 / 1e3) and math.isclose(out["perf/hfu"], 4 * forward / 2e3)
    assert math.isclose(out["perf/tokens_per_s"], unique / 2.0)
    assert out["perf/unshared_mfu"] > out["perf/mfu"]  # every prompt counted as if computed
    chains = FlopModel(1000, 16, 2, tree=False)  # one chain per sample: every token computed
    out = step_metrics(step_in, {"perf/step_s": 2.0}, version=1, ledger=Ledger(), drops=Counter(),
                       flops=chains, peak_tflops=1e-9, last_sync={}, token_budget=64)
    assert math.isclose(out["perf/mfu"], out["perf/unshared_mfu"]) and out["perf/hfu"] == out["perf/mfu"]
