"""The trainer's Engine under FSDP2 on CPU ranks (gloo) against the same steps in one process.

  OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node 2 \\
      tests/unit/trainer/fsdp_engine_worker.py MODEL_DIR OUT.json

Rank 0 first trains a single-process Engine (engine_factory.build_engine) on every row of
each micro-batch; then every rank trains its own rows under FSDP2
(fsdp.build_sharded_engine) from the same start weights. Rank 0 writes both runs'
step stats, the gathered weights' distance to the reference and the gather checks
to OUT.json (tests/unit/trainer/test_fsdp_engine.py asserts on it).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.trainer.engine_factory import build_engine
from agrpo.services.trainer.fsdp import build_sharded_engine, full_weights_for_sync, weights_for_sync
from agrpo.services.trainer.packing import TokenBudgetBatcher, iter_batches
from agrpo.services.trainer.sample import Sample
from agrpo.services.trainer.weight_sync.transports import named_weights

STEPS = 3
TREE = [True, True, False]  # the tree path twice, then the unpacked path
KEYS = ("loss", "grad_norm", "entropy", "ratio", "kl", "clip_ratio/region_mean", "aux_loss")


def groups(step: int, n_groups: int = 3, size: int = 4, vocab: int = 1000) -> list[Sample]:
    """GRPO groups: samples sharing a prompt, own completions, advantages, old logprobs."""
    rng = random.Random(100 + step)
    out = []
    for g in range(n_groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randrange(6, 12))]
        for k in range(size):
            comp = [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 9))]
            ids = prompt + comp
            mask = [0] * len(prompt) + [1] * len(comp)
            old = [-rng.uniform(4, 9) if m else 0.0 for m in mask]
            out.append(Sample(f"s{step}g{g}k{k}", f"s{step}g{g}", (g, step), 0, ids, mask, old,
                              rng.uniform(-1, 1)))
    return out


def step_batches(step: int, rows: int):
    """Micro-batches of `rows` rows (one per rank), several per step (grad accumulation)."""
    return list(iter_batches(TokenBudgetBatcher(rows, 512, max_samples=5), groups(step)))


def run(engine, batches) -> list[dict]:
    stats = []
    for step, mbs in enumerate(batches):
        engine.cfg.tree = TREE[step]
        s = engine.train_step(mbs)
        stats.append({k: s[k] for k in KEYS if k in s})
    return stats


def main() -> int:
    model_dir, out_path = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # TRL's loss (no IS weights): the bf16 check compares losses whose ratios the clip bounds.
    cfg = AgrpoConfig(model=model_dir, learning_rate=1e-3, max_grad_norm=0.5, gradient_checkpointing=True,
                      temperature=0.9, seed=0, use_cpu=True, vllm_importance_sampling_correction=False)
    batches = [step_batches(s, world) for s in range(STEPS)]
    res: dict = {"world": world, "micro_batches": [len(b) for b in batches],
                 "rows_terms": [[r.num_terms for r in mb.rows] for b in batches for mb in b]}
    ref_weights = start = None
    if rank == 0:
        ref, _, _ = build_engine(cfg, model_dir)
        start = {n: t.clone() for n, t in named_weights(ref.model)}
        t0 = time.perf_counter()
        res["single"] = run(ref, batches)
        res["single_s"] = time.perf_counter() - t0
        res["single_eval"] = ref.eval_loss(batches[0])
        ref_weights = named_weights(ref.model)
        res["single_weights_for_sync_ok"] = equal_lists(weights_for_sync(ref, torch.float32), ref_weights)
    dist.barrier()

    eng, _, _ = build_sharded_engine(cfg, model_dir)
    t0 = time.perf_counter()
    res["fsdp"] = run(eng, batches)
    res["fsdp_s"] = time.perf_counter() - t0
    res["fsdp_eval"] = eng.eval_loss(batches[0])
    t0 = time.perf_counter()
    full = full_weights_for_sync(eng.root, torch.float32)
    res["gather_units_s"] = time.perf_counter() - t0
    per_param = full_weights_for_sync(eng.root, torch.float32, per_param=True)
    res["weights_for_sync_ok"] = equal_lists(weights_for_sync(eng, torch.float32), full)
    bf16 = full_weights_for_sync(eng.root, torch.bfloat16, dst=0)
    res["dst_elsewhere_empty"] = bool(dst_check(eng))
    res["mixed_precision"] = mixed_precision_check(cfg, model_dir, batches[0])
    if rank == 0:
        compare(res, start, ref_weights, full, per_param, bf16)
    return finish(res, out_path)


def finish(res: dict, out_path: str) -> int:
    """Rank 0 writes the results; every rank leaves the group together."""
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def equal_lists(a, b) -> bool:
    return [n for n, _ in a] == [n for n, _ in b] and all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b))


def dst_check(eng) -> bool:
    """dst=1: rank 1 gets the tensors, rank 0 an empty list (all ranks still gather)."""
    got = full_weights_for_sync(eng.root, torch.bfloat16, dst=1)
    return (len(got) == 0) == (dist.get_rank() != 1)


def mixed_precision_check(cfg, model_dir, mbs) -> dict:
    """bf16 unsharded params (fp32 masters): a step runs; the unit gather is bf16 and
    falls back to full_tensor() for fp32, both equal to the per-parameter gather."""
    eng, _, _ = build_sharded_engine(cfg, model_dir, mixed_precision=True)
    eng.cfg.tree = True
    loss = eng.train_step(mbs)["loss"]
    out = {"loss": loss}
    for dtype in (torch.bfloat16, torch.float32):
        units = full_weights_for_sync(eng.root, dtype)
        ref = full_weights_for_sync(eng.root, dtype, per_param=True)
        key = str(dtype).split(".")[-1]
        out[f"{key}_equal_per_param"] = all(torch.equal(a, b) for (_, a), (_, b) in zip(units, ref))
        out[f"{key}_dtype_ok"] = all(t.dtype == dtype for _, t in units)
    return out


def compare(res, start, ref_weights, full, per_param, bf16) -> None:
    ref = dict(ref_weights)
    res["names_match"] = [n for n, _ in full] == [n for n, _ in ref_weights] == [n for n, _ in bf16]
    res["units_equal_per_param"] = equal_lists(full, per_param)
    worst, num, den = 0.0, 0.0, 0.0
    for name, t in full:
        d = t - ref[name]
        worst = max(worst, float(d.abs().max()))
        num += float(d.pow(2).sum())
        den += float((ref[name] - start[name]).pow(2).sum())
    res["max_abs_diff"] = worst
    res["rel_diff_vs_update"] = num ** 0.5 / max(den ** 0.5, 1e-30)
    res["update_norm"] = den ** 0.5
    same = sum(int((t == ref[n].to(torch.bfloat16)).sum()) for n, t in bf16)
    res["bf16_identical"] = same / sum(t.numel() for _, t in bf16)
    res["bf16_dtype"] = all(t.dtype == torch.bfloat16 for _, t in bf16)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
