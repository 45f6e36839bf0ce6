"""gpu_fsdp2.py: FSDP2 (torch fully_shard) on 2 GPUs equals one GPU, and the gather for weight sync.

  torchrun --nproc_per_node 2 benchmarks/gpu_fsdp2.py --model /tmp/qwen2-0.5b --steps 3 --results fsdp2.jsonl

Rank 0 first trains a reference copy alone on the whole batch (fp32, TF32 off, AdamW);
then both ranks train the same start weights under FSDP2 (each decoder layer and the
root sharded), each on half of the batch (FSDP2 averages gradients over ranks, so the
step is the same maths). After the steps, every parameter is gathered with
`full_tensor()` and cast to bf16 - exactly what a weight sync sends - and rank 0
compares it with the reference: max |diff| and ||diff|| / ||reference change||.
The loss is GRPO-shaped: -(advantage * token logprob) over completion tokens.
Also timed: one step single-GPU vs FSDP2, and the full-state gather (ms).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time


def batch(n: int, prompt: int, completion: int, vocab: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (n, prompt + completion), generator=g)
    adv = torch.randn(n, generator=g)
    return ids, adv


def loss_fn(model, ids, adv, prompt: int, full_n: int):
    """Sum over this rank's sequences of -(adv * mean completion logprob), / full batch size."""
    import torch

    logits = model(input_ids=ids).logits.float()
    lp = torch.log_softmax(logits[:, prompt - 1:-1], dim=-1)
    tok = lp.gather(2, ids[:, prompt:, None])[..., 0]
    return -(adv[:, None] * tok).mean(dim=1).sum() / full_n


def step(model, opt, ids, adv, prompt, full_n, scale: float = 1.0):
    loss = loss_fn(model, ids, adv, prompt, full_n) * scale
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--completion", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--results")
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU: a logic check only, no timings")
    a = ap.parse_args()
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if a.cpu:
        dev = torch.device("cpu")
        torch.cuda.synchronize = lambda: None
        torch.cuda.get_device_name = lambda: "cpu"
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dev = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=dev)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa").to(dev)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids, adv = batch(a.batch, a.prompt, a.completion, model.config.vocab_size)
    ids, adv = ids.to(dev), adv.to(dev)
    res: dict = dict(model=a.model, world=world, steps=a.steps, batch=a.batch,
                     seq=a.prompt + a.completion, gpu=torch.cuda.get_device_name())

    ref_params, t_single = None, []
    if rank == 0:  # the single-GPU reference, whole batch
        ref = copy.deepcopy(model)
        opt = torch.optim.AdamW(ref.parameters(), lr=a.lr, weight_decay=0.0)
        for _ in range(a.steps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            step(ref, opt, ids, adv, a.prompt, a.batch)
            torch.cuda.synchronize()
            t_single.append((time.perf_counter() - t) * 1e3)
        ref_params = {n: p.detach() for n, p in ref.named_parameters()}
        del opt
    dist.barrier()

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    per = a.batch // world
    mine = slice(rank * per, (rank + 1) * per)
    t_fsdp = []
    for _ in range(a.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        # FSDP2 averages gradients over ranks: scale by world so the sum matches one GPU's
        step(model, opt, ids[mine], adv[mine], a.prompt, a.batch, scale=world)
        torch.cuda.synchronize()
        t_fsdp.append((time.perf_counter() - t) * 1e3)

    torch.cuda.synchronize()
    t = time.perf_counter()
    gathered = [(n, p.full_tensor().to(torch.bfloat16)) for n, p in model.named_parameters()]
    torch.cuda.synchronize()
    res["gather_bf16_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    res["gather_bytes"] = sum(t.numel() * t.element_size() for _, t in gathered)
    res["fsdp2_step_ms"] = round(statistics.median(t_fsdp), 1)
    full32 = {n: p.full_tensor() for n, p in model.named_parameters()}  # collective: all ranks
    if rank == 0:
        res["single_step_ms"] = round(statistics.median(t_single), 1)
        worst, num, den, same16, elems = 0.0, 0.0, 0.0, 0, 0
        for name, g16 in gathered:
            r = ref_params[name]
            d = full32[name] - r
            worst = max(worst, float(d.abs().max()))
            num += float(d.pow(2).sum())
            den += float((r - start[name]).pow(2).sum())
            same16 += int((g16 == r.to(torch.bfloat16)).sum())
            elems += r.numel()
        res.update(tensors=len(gathered), max_abs_diff_fp32=worst,
                   rel_diff_vs_update=(num ** 0.5) / max(den ** 0.5, 1e-30),
                   bf16_elements_identical=same16 / elems)
        res["ok"] = res["rel_diff_vs_update"] < 1e-2 and res["bf16_elements_identical"] > 0.999
        print("[fsdp2]", json.dumps(res), flush=True)
        if a.results:
            with open(a.results, "a") as f:
                f.write(json.dumps(res) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
