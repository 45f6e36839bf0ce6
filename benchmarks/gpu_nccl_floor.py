"""gpu_nccl_floor.py: the hardware floor for a weight sync: raw NCCL broadcasts GPU->GPU.

Run on a 2-GPU machine (rank 0 sends, like the trainer; rank 1 receives, like vLLM):

  torchrun --nproc_per_node 2 benchmarks/gpu_nccl_floor.py --presets qwen2-0.5b qwen2-1.5b qwen2-7b \
      --results floor.jsonl
  python3 benchmarks/gpu_nccl_floor.py --table floor.jsonl

For each model shape (scripts/gpu/make_tiny.py PRESETS, built on the meta device) it
broadcasts the same bytes in the same chunks as a packed weight sync (1 GiB buffer,
flush once the running size exceeds it), from buffers that already exist: no packing,
no HTTP, no load. It also times packing alone (torch.cat of the bf16 parameters into
the chunk buffers) and big single buffers for the link's bandwidth. Medians of
`--reps` timed runs after `--warmup`; both ranks sync and barrier between runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUFFER = 1 << 30


def shapes_for(preset: str) -> list[tuple[str, list[int]]]:
    """Parameter names and shapes in named_parameters order (tied weights once)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(HERE.parent / "scripts" / "gpu"))
    from make_tiny import PRESETS

    cfg = Qwen2Config(bos_token_id=1, eos_token_id=2, pad_token_id=0, **PRESETS[preset])
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    return [(n, list(p.shape)) for n, p in model.named_parameters()]


def timed(fn, reps: int, warmup: int, barrier) -> list[float]:
    import torch

    out = []
    for i in range(warmup + reps):
        barrier()
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t) * 1e3
        if i >= warmup:
            out.append(dt)
    return out


def run_preset(preset: str, rank: int, reps: int, warmup: int, barrier) -> dict:
    import torch
    import torch.distributed as dist

    shapes = shapes_for(preset)
    sizes = [2 * int(torch.Size(s).numel()) for _, s in shapes]  # bf16
    sys.path.insert(0, str(HERE.parent))
    from agrpo.services.trainer.weight_sync.nccl import packed_chunks  # the trainer's own bucket rule

    plan = packed_chunks(sizes, BUFFER)
    bufs = [torch.empty(sum(sizes[i] for i in idx), dtype=torch.uint8, device="cuda") for idx in plan]
    for b in bufs:
        b.random_(0, 256)  # never time zeros
    bcast = lambda: [dist.broadcast(b, src=0) for b in bufs]  # noqa: E731
    t_floor = timed(bcast, reps, warmup, barrier)
    row = dict(label=preset, bytes=sum(sizes), tensors=len(sizes), chunks=len(plan),
               floor_ms=round(statistics.median(t_floor), 2), floor_min_ms=round(min(t_floor), 2))
    row["floor_GBps"] = round(row["bytes"] / 1e9 / (row["floor_ms"] / 1e3), 1)
    if rank == 0:  # packing cost alone (the sender's only extra work before the wire)
        params = [torch.randn(s, dtype=torch.bfloat16, device="cuda") for _, s in shapes]

        def pack():
            for idx in plan:
                torch.cat([params[i].view(torch.uint8).reshape(-1) for i in idx])
        t_pack = timed(pack, reps, warmup, lambda: None)
        row["pack_ms"] = round(statistics.median(t_pack), 2)
        del params
    bufs = None  # free before the next preset
    torch.cuda.empty_cache()
    return row


def run_bandwidth(rank: int, sizes_mib: list[int], reps: int, warmup: int, barrier) -> list[dict]:
    import torch
    import torch.distributed as dist

    rows = []
    for mib in sizes_mib:
        b = torch.empty(mib << 20, dtype=torch.uint8, device="cuda").random_(0, 256)
        t = timed(lambda b=b: dist.broadcast(b, src=0), reps, warmup, barrier)
        med = statistics.median(t)
        rows.append(dict(label=f"buffer {mib} MiB", bytes=mib << 20, tensors=1, chunks=1,
                         floor_ms=round(med, 3), floor_min_ms=round(min(t), 3),
                         floor_GBps=round((mib << 20) / 1e9 / (med / 1e3), 1)))
        b = None
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="*", default=["qwen2-0.5b", "qwen2-1.5b", "qwen2-7b"])
    ap.add_argument("--bandwidth-mib", nargs="*", type=int, default=[64, 1024, 4096])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--results")
    ap.add_argument("--table")
    a = ap.parse_args()
    if a.table:
        return print_table(a.table)
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    barrier = dist.barrier
    rows = run_bandwidth(rank, a.bandwidth_mib, a.reps, a.warmup, barrier)
    for p in a.presets:
        rows.append(run_preset(p, rank, a.reps, a.warmup, barrier))
        if rank == 0:
            print("[floor]", json.dumps(rows[-1]), flush=True)
    if rank == 0:
        meta = dict(nccl=".".join(map(str, torch.cuda.nccl.version())), torch=torch.__version__,
                    gpu=torch.cuda.get_device_name(), world=dist.get_world_size())
        if a.results:
            with open(a.results, "a") as f:
                for r in rows:
                    f.write(json.dumps({**meta, **r}) + "\n")
        for r in rows:
            print("[floor]", json.dumps(r), flush=True)
    dist.destroy_process_group()
    return 0


def print_table(path: str) -> int:
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    print(f"{'what':<16}{'MiB':>9}{'chunks':>7}{'floor ms':>10}{'min ms':>9}{'GB/s':>8}{'pack ms':>9}")
    for r in rows:
        print(f"{r['label']:<16}{r['bytes'] / 2**20:>9.1f}{r['chunks']:>7}{r['floor_ms']:>10}"
              f"{r['floor_min_ms']:>9}{r['floor_GBps']:>8}{r.get('pack_ms', '-')!s:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
