"""Trainer layouts agree on the GPU, and FSDP2 on 2 GPUs equals one GPU (benchmarks' own checks)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    import gpu_train_throughput as g  # benchmarks/ is on pytest's pythonpath

    return g


def _logprobs(eng, rows, is_tree):
    import torch

    return torch.cat([eng.row_logprobs(r, is_tree)[0].detach().float() for r in rows])


def _loss_and_grads(eng, rows):
    """The micro-batch's loss and the flattened fp32 gradient of one forward/backward."""
    import torch

    eng.model.zero_grad(set_to_none=True)
    total = 0.0
    for row in rows:
        loss, _ = eng.row_loss(row, sum(r.num_terms for r in rows), len(rows))
        loss.backward()
        total += float(loss.detach())
    grads = torch.cat([p.grad.float().flatten() for p in eng.model.parameters() if p.grad is not None])
    return total, grads


@pytest.mark.timeout(600)
def test_tree_packed_padded_layouts_agree_in_fp32(tiny_gpu_model):
    g = _bench()
    samples = g.make_samples(2, 4, 128, 32, 1024)
    tree, packed = g.tree_rows(samples, 4), g.plain_rows(samples, 4)
    assert sum(r.num_tokens for r in tree) < sum(r.num_tokens for r in packed)
    eng = g.build(str(tiny_gpu_model), gc=False, attention="sdpa", compile_head=False)
    eng.model.float()
    eng.cfg.autocast = None
    ref = _logprobs(eng, tree, False)
    for rows in (tree, packed):
        assert (_logprobs(eng, rows, True) - ref).abs().max() < 1e-4


@pytest.mark.timeout(600)
@pytest.mark.parametrize("compiled", [False, True], ids=["flex", "flex_compiled_layers_and_head"])
def test_flex_tree_equals_dense_sdpa_in_bf16(tiny_gpu_model, compiled):
    """The Engine's CUDA path (flex BlockMask) == the dense-mask SDPA path: logprobs, loss, grads.

    Row lengths 115 + 3 * 33 (not block multiples: the Engine pads) and a second, longer
    length (the dynamic recompile) both go through; gradient checkpointing on, as in training.
    """
    g = _bench()
    samples = g.make_samples(2, 4, 100, 33, 1024) + g.make_samples(1, 4, 300, 50, 1024, seed=2)
    tree, packed = g.tree_rows(samples, 4), g.plain_rows(samples, 4)
    dense = g.build(str(tiny_gpu_model), gc=True, attention="sdpa", compile_head=False)
    flex = g.build(str(tiny_gpu_model), gc=True, attention="flex", compile_layers=compiled, compile_head=compiled)
    assert flex.flex and not dense.flex
    base = _logprobs(dense, tree, True)
    for rows in (tree, packed):
        d = (_logprobs(flex, rows, True) - base).abs().max()
        assert d < 0.05, float(d)
    loss_d, grad_d = _loss_and_grads(dense, tree)
    loss_f, grad_f = _loss_and_grads(flex, tree)
    rel = float((grad_f - grad_d).norm() / grad_d.norm())
    print(f"bf16 flex vs dense: loss {loss_f:.6f} vs {loss_d:.6f}, grad rel diff {rel:.2e}")
    assert abs(loss_f - loss_d) <= 2e-2 * abs(loss_d) + 1e-3
    assert rel < 5e-2


@pytest.mark.two_gpus
@pytest.mark.timeout(600)
@pytest.mark.parametrize("extra", [[], ["--autocast"]], ids=["fp32", "bf16_autocast"])
def test_fsdp2_two_gpus_equals_one(tiny_gpu_model, tmp_path, extra):
    """The trainer's Engine under FSDP2 on 2 GPUs == the plain Engine on one (fp32; bf16 autocast)."""
    out = tmp_path / "fsdp2.jsonl"
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "benchmarks" / "gpu_fsdp2.py"), "--model", str(tiny_gpu_model), "--prompt", "32",
           "--completion", "32", "--steps", "3", "--results", str(out), *extra]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text().splitlines()[-1])
    assert res["ok"], res
    assert res["engine"] and res["names_match"] and res["gather_units_equal_per_param"]
    assert res["gather_bytes"] > 0 and res["rel_diff_vs_update"] < 1e-2
    for single, sharded in zip(res["loss_single"], res["loss_fsdp2"], strict=True):
        assert abs(single - sharded) <= 1e-2 * abs(single) + 1e-4, (single, sharded)  # step 1: same maths
