"""Tree attention masks: the pre-order interval test, padding, the BlockMask, flex == dense SDPA."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from agrpo.services.trainer import tree_attention as ta
from agrpo.services.trainer.packing import TokenBudgetBatcher, iter_batches, subtree_end


def _random_forest(n: int, seed: int) -> list[int]:
    """Parents of a random pre-ordered forest: each node hangs off a node on the current root path."""
    rng = random.Random(seed)
    parent, path = [], []
    for i in range(n):
        del path[rng.randrange(len(path) + 1):]  # pop back to some ancestor (or to a new root)
        parent.append(path[-1] if path else -1)
        path.append(i)
    return parent


def _ancestors(parent: list[int]) -> torch.Tensor:
    """Reference [N, N] relation by walking parents: allow[q, kv] iff kv is q or an ancestor."""
    n = len(parent)
    allow = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        j = q
        while j >= 0:
            allow[q, j] = True
            j = parent[j]
    return allow


def test_subtree_end_and_dense_mask_are_the_ancestor_relation():
    assert subtree_end([-1, 0, 1, 1, -1]) == [3, 3, 2, 3, 4]
    for seed in range(5):
        parent = _random_forest(60, seed)
        end = torch.tensor(subtree_end(parent))
        assert torch.equal(ta.dense_mask(end), _ancestors(parent))


def test_padding_adds_lone_roots():
    assert [ta.padded_length(n) for n in (1, 128, 129, 5127)] == [128, 128, 256, 5248]
    ids, pos, end = ta.pad_tree([7, 8, 9], [0, 1, 1], [2, 1, 2], 5)
    assert (ids, pos, end) == ([7, 8, 9, 0, 0], [0, 1, 1, 0, 0], [2, 1, 2, 3, 4])
    allow = ta.dense_mask(torch.tensor(end))
    assert not allow[:3, 3:].any() and torch.equal(allow[3:, 3:], torch.eye(2, dtype=torch.bool))


def _blocks(bm, which: str) -> list[list[int]]:
    """Per q block, the listed kv blocks of a BlockMask ('kv' partial, 'full_kv' full)."""
    counts, idx = getattr(bm, f"{which}_num_blocks")[0, 0], getattr(bm, f"{which}_indices")[0, 0]
    return [idx[i, :c].tolist() for i, c in enumerate(counts.tolist())]


@pytest.mark.parametrize("seed", [7, 8])
def test_block_mask_equals_create_block_mask(seed):
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    parent = _random_forest(300 + 40 * seed, seed)
    size = ta.padded_length(len(parent))
    end = torch.tensor(ta.pad_tree(parent, parent, subtree_end(parent), size)[2])
    bm = ta.block_mask(end)
    assert torch.equal(create_mask(bm.mask_mod, 1, 1, size, size, "cpu")[0, 0], ta.dense_mask(end))
    ref = create_block_mask(bm.mask_mod, None, None, size, size, device="cpu")
    for which in ("kv", "full_kv", "q", "full_q"):
        assert _blocks(bm, which) == _blocks(ref, which), which
    assert sum(map(len, _blocks(bm, "kv") + _blocks(bm, "full_kv"))) < (size // ta.BLOCK) ** 2  # blocks skipped


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    from agrpo.services.common.config import AgrpoConfig
    from agrpo.services.trainer.engine import Engine
    from agrpo.services.trainer.engine_factory import build_engine

    cfg = AgrpoConfig(model=str(tiny_model_dir), temperature=0.9)
    dense, _, _ = build_engine(cfg, str(tiny_model_dir))
    flex = Engine(dense.root, dense.optimizer, dense.scheduler, replace(dense.cfg, attention="flex"))
    return dense, flex


def test_flex_tree_forward_equals_dense_on_cpu(engines, make_groups):
    """Eager flex (forward only on CPU) with a padded row == the dense SDPA mask == unpacked."""
    dense, flex = engines
    assert flex.flex and not dense.flex
    mb = next(iter_batches(TokenBudgetBatcher(1, 512), make_groups(n_groups=2, size=3, prompt_len=10)))
    row = mb.rows[0]
    assert row.num_tokens % ta.BLOCK  # the flex path pads this row
    with torch.no_grad():
        ref, ent_ref = dense.row_logprobs(row, tree=True)
        out, ent = flex.row_logprobs(row, tree=True)
        flat, _ = flex.row_logprobs(row, tree=False)  # unpacked rows still reach SDPA
    assert torch.allclose(out, ref, atol=1e-5) and torch.allclose(ent, ent_ref, atol=1e-5)
    assert torch.allclose(flat, ref, atol=1e-4)


def test_attention_choice():
    from agrpo.services.trainer.engine import _use_flex

    assert _use_flex("auto", torch.device("cuda")) and not _use_flex("auto", torch.device("cpu"))
    assert _use_flex("flex", torch.device("cpu")) and not _use_flex("sdpa", torch.device("cuda"))
    with pytest.raises(ValueError):
        _use_flex("fa3", torch.device("cpu"))


def test_eager_layers_take_the_dense_mask_for_short_rows_only_under_auto():
    from agrpo.services.trainer.engine import DENSE_ROW_MAX, _dense_up_to

    assert _dense_up_to("auto", layers_compiled=False) == DENSE_ROW_MAX  # no flex compile for a short row
    assert _dense_up_to("auto", layers_compiled=True) == 0  # compiled layers trace flex for every row
    assert _dense_up_to("flex", layers_compiled=False) == 0  # asked for: always flex


def test_moe_aux_loss_leaves_the_pads_out(make_groups):
    from transformers import AutoModelForCausalLM, Qwen2MoeConfig

    from agrpo.services.trainer.engine import Engine, EngineConfig
    from agrpo.services.trainer.loss import LossConfig

    torch.manual_seed(0)
    cfg = Qwen2MoeConfig(vocab_size=1024, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, num_experts=4,
                         num_experts_per_tok=2, shared_expert_intermediate_size=16)
    model = AutoModelForCausalLM.from_config(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    mb = next(iter_batches(TokenBudgetBatcher(1, 512), make_groups(n_groups=1, size=2)))
    losses = []
    for attention in ("sdpa", "flex"):
        eng = Engine(model, opt, sched, EngineConfig(LossConfig(), attention=attention, router_aux_loss_coef=0.5))
        losses.append((eng.eval_loss([mb]), float(eng.last_aux)))
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
