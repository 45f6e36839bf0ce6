"""A LoRA model under FSDP2 on CPU ranks (gloo) against the same steps in one process.

  OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node 2 \\
      tests/unit/trainer/fsdp_lora_worker.py MODEL_DIR SHARDS_DIR OUT.json

Rank 0 trains a single-process LoRA Engine on every row of each micro-batch; every rank then
trains its own rows of the same steps under FSDP2 (the base weights sharded and frozen, the
adapter sharded and trained). Rank 0 writes to OUT.json: both runs' step stats, how far the
gathered adapter and the gathered merged weights are from the single-process ones, and a
checkpoint round trip (the shards' tensors, and a step of the restored engine against the
same step of the one that saved it). tests/unit/trainer/test_fsdp_lora.py asserts on it.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fsdp_engine_worker import STEPS, finish, run, step_batches

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.trainer.engine_factory import build_engine
from agrpo.services.trainer.fsdp import adapter_for_sync, build_sharded_engine, weights_for_sync
from agrpo.services.trainer.ranks import load_shards, save_shards


def main() -> int:
    model_dir, shards_dir, out_path = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = AgrpoConfig(model=model_dir, learning_rate=1e-2, max_grad_norm=0.5, temperature=0.9, seed=0,
                      use_cpu=True, vllm_importance_sampling_correction=False,
                      peft={"r": 4, "lora_alpha": 8, "target_modules": "all-linear"})
    batches = [step_batches(s, world) for s in range(STEPS + 1)]
    res: dict = {"world": world}
    ref = None
    if rank == 0:
        ref, _, _ = build_engine(cfg, model_dir)
        res["single"] = run(ref, batches[:STEPS])
    dist.barrier()

    eng, _, _ = build_sharded_engine(cfg, model_dir)
    res["fsdp"] = run(eng, batches[:STEPS])
    adapter = adapter_for_sync(eng, torch.float32, dst=0)
    merged = weights_for_sync(eng, torch.float32, dst=0)
    res["elsewhere_empty"] = (not adapter and not merged) if rank else True
    saved = save_shards(eng, shards_dir)  # what a multi-rank checkpoint writes: shards + rank 0's adapter
    again, _, _ = build_sharded_engine(cfg, model_dir)
    load_shards(again, shards_dir)
    res["restored"] = run(again, batches[STEPS:])
    res["continued"] = run(eng, batches[STEPS:])
    if rank == 0:
        assert ref is not None
        res["adapter"] = distances(adapter, adapter_for_sync(ref, torch.float32))
        res["merged"] = distances(merged, weights_for_sync(ref, torch.float32))
        res["saved_is_adapter"] = distances(saved, adapter_for_sync(ref, None))
        res["shard_tensors"] = sorted(dcp.FileSystemReader(shards_dir).read_metadata().state_dict_metadata)
    return finish(res, out_path)


def distances(got, want) -> dict:
    """Both lists' names, the largest difference of a tensor from its namesake, got's norm."""
    want_d = dict(want)
    diffs = [float((t.float() - want_d[n].float()).abs().max()) if n in want_d else float("inf") for n, t in got]
    return {"names": [n for n, _ in got], "want_names": [n for n, _ in want], "max_abs_diff": max(diffs),
            "norm": sum(float(t.float().norm()) ** 2 for _, t in got) ** 0.5}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
