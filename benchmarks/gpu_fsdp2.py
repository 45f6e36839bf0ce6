"""gpu_fsdp2.py: the trainer's Engine under FSDP2 (torch fully_shard) on 2 GPUs equals one GPU,
and the gather for weight sync.

  torchrun --nproc_per_node 2 benchmarks/gpu_fsdp2.py --model /tmp/qwen2-0.5b --steps 3 --results fsdp2.jsonl

The batch is GRPO-shaped: groups of --group samples sharing a --prompt-token prompt,
each with its own --completion tokens, advantage, and behaviour logprobs (the start
model's own, plus noise). It is packed by the trainer's planner into one micro-batch
of one prefix-tree row per rank. Rank 0 first trains a reference copy alone through
the trainer's `Engine` (every row; fp32, TF32 off unless --autocast; AdamW, clipping
at 1.0); then every rank trains the same start weights through the same `Engine`
sharded by `agrpo.services.trainer.fsdp.shard_model` (each decoder layer + the root), on its
own row. Afterwards the weights are gathered as a sync sends them (bf16, HF names):
per parameter with `full_tensor()` (gather_bf16_ms, the old way) and one all-gather
per FSDP unit (`full_weights_for_sync`, gather_units_bf16_ms); rank 0 compares the
fp32 gather with the reference: max |diff| and ||diff|| / ||reference change||.
Also timed: one step single-GPU vs FSDP2 (medians).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def make_samples(n: int, group: int, prompt: int, completion: int, vocab: int, seed: int = 0):
    """n samples in groups of `group` sharing a prompt; placeholder behaviour logprobs."""
    from agrpo.services.trainer.sample import Sample

    rng = random.Random(seed)
    out = []
    for g in range((n + group - 1) // group):
        head = [rng.randrange(4, vocab) for _ in range(prompt)]
        for k in range(min(group, n - g * group)):
            ids = head + [rng.randrange(4, vocab) for _ in range(completion)]
            mask = [0] * prompt + [1] * completion
            adv = rng.uniform(-1, 1)
            out.append(Sample(f"g{g}k{k}", f"g{g}", (g, 0), 0, ids, mask, [0.0] * len(ids), adv))
    return out


def micro_batch(samples, world: int):
    """One micro-batch, one row per rank (groups kept whole, balanced by attention load)."""
    from agrpo.services.trainer.packing import FixedCountBatcher, iter_batches

    batches = list(iter_batches(FixedCountBatcher(world, len(samples) // world), samples))
    assert len(batches) == 1, len(batches)
    return batches[0]


def on_policy_old_logprobs(engine, mb, noise: float = 0.05, seed: int = 0) -> None:
    """Behaviour logprobs = the start model's own plus noise, so ratios sit near 1."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for row in mb.rows:
            logp = engine.row_logprobs(row)[0].float().cpu()
            row.old_logprobs = (logp + noise * torch.randn(logp.shape, generator=g)).tolist()


def make_engine(model, lr: float, autocast):
    """The trainer's Engine over a model or a sharded root (AdamW over its parameters)."""
    import torch

    from agrpo.services.trainer.engine import Engine, EngineConfig
    from agrpo.services.trainer.loss import LossConfig

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    return Engine(model, opt, sched, EngineConfig(LossConfig(), 1.0, tree=True, autocast=autocast))


def timed_steps(engine, mb, steps: int, sync) -> tuple[list[float], list[dict]]:
    times, stats = [], []
    for _ in range(steps):
        sync()
        t = time.perf_counter()
        stats.append(engine.train_step([mb]))
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return times, stats


def timed_gather(root, dtype, reps: int, sync, **kw):
    from agrpo.services.trainer.fsdp import full_weights_for_sync

    times, out = [], None
    for _ in range(reps):
        out = None
        sync()
        t = time.perf_counter()
        out = full_weights_for_sync(root, dtype, **kw)
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(times), 1), out


def reference(model, mb, a, autocast, sync):
    """Rank 0 alone: behaviour logprobs, then the steps through the plain Engine (every row)."""
    ref = copy.deepcopy(model)
    eng = make_engine(ref, a.lr, autocast)
    on_policy_old_logprobs(eng, mb)
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    times, stats = timed_steps(eng, mb, a.steps, sync)
    for p in ref.parameters():
        p.grad = None
    return times, stats, start, {n: p.detach() for n, p in ref.named_parameters()}


def share_old_logprobs(mb) -> None:
    """Every rank trains on rank 0's behaviour logprobs."""
    import torch.distributed as dist

    olds = [[r.old_logprobs for r in mb.rows]]
    dist.broadcast_object_list(olds, src=0)
    for row, old in zip(mb.rows, olds[0]):
        row.old_logprobs = old


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="samples in the step (all ranks)")
    ap.add_argument("--group", type=int, default=4, help="samples sharing one prompt")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--completion", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--gather-reps", type=int, default=3)
    ap.add_argument("--autocast", action="store_true", help="bf16 autocast (the trainer's CUDA setting)")
    ap.add_argument("--gc", action="store_true", help="gradient checkpointing (the trainer's default)")
    ap.add_argument("--mixed-precision", action="store_true",
                    help="FSDP2 bf16 params / fp32 reduce (not bit-comparable with the reference)")
    ap.add_argument("--results")
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU: a logic check only, no timings")
    return ap.parse_args()


def setup(a):
    import torch
    import torch.distributed as dist

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if a.cpu:
        dist.init_process_group("gloo")
        return torch.device("cpu"), (lambda: None), "cpu"
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=dev)
    return dev, torch.cuda.synchronize, torch.cuda.get_device_name()


def main() -> int:
    a = parse()
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from agrpo.services.trainer.fsdp import full_weights_for_sync, shard_model

    dev, sync, gpu = setup(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    autocast = torch.bfloat16 if a.autocast else None
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa")
    model = model.to(dev)
    model.config.use_cache = False
    if a.gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    mb = micro_batch(make_samples(a.batch, a.group, a.prompt, a.completion, model.config.vocab_size), world)
    res: dict = dict(model=a.model, world=world, steps=a.steps, batch=a.batch, seq=a.prompt + a.completion,
                     gpu=gpu, engine=True, autocast=a.autocast, mixed_precision=a.mixed_precision, gc=a.gc,
                     row_tokens=[r.num_tokens for r in mb.rows], row_terms=[r.num_terms for r in mb.rows])
    t_single = s_single = start = ref_params = None
    if rank == 0:
        t_single, s_single, start, ref_params = reference(model, mb, a, autocast, sync)
    share_old_logprobs(mb)
    dist.barrier()

    root = shard_model(model, mixed_precision=a.mixed_precision)
    engine = make_engine(root, a.lr, autocast)  # after sharding: the optimizer holds the DTensors
    t_fsdp, s_fsdp = timed_steps(engine, mb, a.steps, sync)

    res["gather_bf16_ms"], per_param = timed_gather(root, torch.bfloat16, a.gather_reps, sync, per_param=True)
    res["gather_units_bf16_ms"], units = timed_gather(root, torch.bfloat16, a.gather_reps, sync)
    res["gather_units_dst0_bf16_ms"], _ = timed_gather(root, torch.bfloat16, a.gather_reps, sync, dst=0)
    res["gather_bytes"] = sum(t.numel() * t.element_size() for _, t in units)
    res["gather_units_equal_per_param"] = all(torch.equal(x, y) for (_, x), (_, y) in zip(units, per_param))
    res["fsdp2_step_ms"] = round(statistics.median(t_fsdp), 1)
    res["loss_fsdp2"] = [s["loss"] for s in s_fsdp]
    res["grad_norm_fsdp2"] = [s["grad_norm"] for s in s_fsdp]
    full32 = dict(full_weights_for_sync(root, torch.float32))  # collective: all ranks
    if rank == 0:
        res["single_step_ms"] = round(statistics.median(t_single), 1)
        res["loss_single"] = [s["loss"] for s in s_single]
        res["grad_norm_single"] = [s["grad_norm"] for s in s_single]
        compare(res, units, full32, ref_params, start)
        print("[fsdp2]", json.dumps(res), flush=True)
        if a.results:
            with open(a.results, "a") as f:
                f.write(json.dumps(res) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def compare(res: dict, gathered16, full32, ref_params, start) -> None:
    import torch

    worst, num, den, same16, elems = 0.0, 0.0, 0.0, 0, 0
    for name, g16 in gathered16:
        r = ref_params[name]
        d = full32[name] - r
        worst = max(worst, float(d.abs().max()))
        num += float(d.pow(2).sum())
        den += float((r - start[name]).pow(2).sum())
        same16 += int((g16 == r.to(torch.bfloat16)).sum())
        elems += r.numel()
    res.update(tensors=len(gathered16), max_abs_diff_fp32=worst,
               rel_diff_vs_update=(num ** 0.5) / max(den ** 0.5, 1e-30),
               bf16_elements_identical=same16 / elems,
               names_match=[n for n, _ in gathered16] == list(ref_params))
    same = res["names_match"] and res["gather_units_equal_per_param"]
    if res["mixed_precision"]:  # bf16 params in FSDP2 only: the first step's loss agrees roughly
        first = abs(res["loss_fsdp2"][0] - res["loss_single"][0]) / max(abs(res["loss_single"][0]), 1e-6)
        res["ok"] = same and first < 0.05
    else:
        res["ok"] = same and res["rel_diff_vs_update"] < 1e-2 and res["bf16_elements_identical"] > 0.999


if __name__ == "__main__":
    sys.exit(main())
