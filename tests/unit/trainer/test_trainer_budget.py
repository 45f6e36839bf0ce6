"""The default row budget (services/trainer/budget.py): what memory holds, between the longest
sample and the cap, and what the first step still allocates."""

from __future__ import annotations

import torch

from agrpo.services.trainer.budget import GPU_MAX_ROW, RowShape, first_step_bytes, row_budget

GiB = 1 << 30
QWEN_1_5B = dict(layers=28, hidden=1536, intermediate=8960, kv_hidden=256, vocab=151_936, act_bytes=2)


def test_a_row_holds_what_the_free_memory_holds_and_checkpointing_holds_more():
    plain, ckpt = RowShape(**QWEN_1_5B, recompute=False), RowShape(**QWEN_1_5B, recompute=True)
    assert ckpt.bytes_per_token < plain.bytes_per_token / 4
    budget, fits = row_budget(plain, 40 * GiB, floor=2048, cap=GPU_MAX_ROW)
    assert budget == fits and 5_000 < fits < 20_000
    # Measured on an H100 (docs/gpu.md): a 10k-token tree row of this shape without checkpointing
    # peaked 20.7 GiB over the weights and optimizer: the estimate must not hold more than that.
    assert fits * plain.bytes_per_token <= 40 * GiB and 10_254 * plain.bytes_per_token > 20.7 * GiB
    assert row_budget(ckpt, 40 * GiB, floor=2048, cap=GPU_MAX_ROW)[1] > 6 * fits


def test_the_longest_sample_is_the_floor_and_the_cap_bounds_the_row():
    shape = RowShape(**QWEN_1_5B, recompute=False)
    budget, fits = row_budget(shape, 2 * GiB, floor=2048, cap=GPU_MAX_ROW)
    assert fits < 2048 and budget == 2048
    assert row_budget(shape, 10_000 * GiB, floor=2048, cap=4096)[0] == 4096


def test_the_head_counts_one_vocab_chunk_per_term():
    small = RowShape(**{**QWEN_1_5B, "vocab": 1024}, recompute=False)
    big = RowShape(**QWEN_1_5B, recompute=False)
    assert big.head_bytes == 32768 * 10 and small.head_bytes == 1024 * 10


def test_the_first_step_allocates_gradients_and_adams_moments_unless_restored():
    model = torch.nn.Linear(100, 10)
    opt = torch.optim.AdamW(model.parameters())
    size = sum(p.numel() for p in model.parameters()) * 4
    assert first_step_bytes(model, opt, torch.device("cpu")) == 3 * size
    model(torch.ones(1, 100)).sum().backward()
    opt.step()
    assert first_step_bytes(model, opt, torch.device("cpu")) == size
    model.bias.requires_grad_(False)
    assert first_step_bytes(model, opt, torch.device("cpu")) == 1000 * 4
