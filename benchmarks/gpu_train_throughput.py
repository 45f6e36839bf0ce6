"""gpu_train_throughput.py: trainer tokens/s and MFU on one GPU, prefix tree vs plain packing.

  python3 benchmarks/gpu_train_throughput.py --model /tmp/qwen2-0.5b --label qwen2-0.5b \
      --groups 2 --group-size 8 --prompt 1024 --completion 512 --results train.jsonl
  python3 benchmarks/gpu_train_throughput.py --table train.jsonl

A GRPO-shaped step: `--groups` groups of `--group-size` samples sharing a random prompt,
one group per packed row (one micro-batch), through the trainer's own Engine
(services/trainer/engine.py: chunked-vocab logprobs, clipped GRPO loss, AdamW step), bf16
weights + bf16 autocast, gradient checkpointing on. Layouts of the same samples:
  tree    the trainer's prefix-tree packing (packing.TreeRow): the shared prompt is
          forwarded once; attention = trie-ancestor mask (dense [N, N] bool to SDPA)
  packed  plain padding-free packing: the same samples back to back in one row, each
          its own chain (block-diagonal causal mask, same SDPA path): no sharing
  padded  the Engine's unpacked path: one padded row per sample
  tree_flex / packed_flex  the same rows through torch's flex_attention (HF
          attn_implementation="flex_attention", compiled) with a BlockMask built from
          the pre-order trie: kv attends iff kv <= q <= subtree_end[kv] (an O(1) mask_mod;
          whole-block skipping instead of an [N, N] mask) - a prototype for the trainer
tokens/s counts the samples' tokens (what the step trains on); MFU = 6 * params *
tokens / time / peak (989 TFLOP/s dense bf16, H200 SXM datasheet), attention FLOPs
left out, so the tree's MFU can exceed what the GPU computed (it skips the repeats):
`computed_tokens` is what went through the model.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PEAK = 989e12


def make_samples(groups: int, size: int, prompt: int, completion: int, vocab: int, seed: int = 0):
    from services.trainer.sample import Sample

    rng = random.Random(seed)
    out = []
    for g in range(groups):
        p = [rng.randrange(4, vocab) for _ in range(prompt)]
        for i in range(size):
            c = [rng.randrange(4, vocab) for _ in range(completion)]
            out.append(Sample(sample_id=f"g{g}s{i}", group_id=f"g{g}", prompt_key=(g, 0), policy_version=0,
                              input_ids=p + c, completion_mask=[0] * prompt + [1] * completion,
                              behavior_logprobs=[-rng.random() * 5 for _ in range(prompt + completion)],
                              advantage=rng.gauss(0, 1), prompt_length=prompt))
    return out


def tree_rows(samples, per_row: int):
    from services.trainer.packing import TreeRow

    rows = []
    for k in range(0, len(samples), per_row):
        row = TreeRow()
        for s in samples[k:k + per_row]:
            row.add(s)
        rows.append(row.pack())
    return rows


def plain_rows(samples, per_row: int):
    """Padding-free packing without sharing: each sample a separate chain in the row."""
    from dataclasses import replace

    rows = []
    for k in range(0, len(samples), per_row):
        parts = tree_rows(samples[k:k + per_row], 1)
        off, acc = 0, None
        for slot, r in enumerate(parts):
            r = replace(r, parent=[p + off if p >= 0 else -1 for p in r.parent],
                        token_index=[t + off for t in r.token_index], segment_id=[slot] * len(r.segment_id))
            if acc is None:
                acc = r
            else:
                acc = replace(acc, **{f: getattr(acc, f) + getattr(r, f) for f in (
                    "input_ids", "position_ids", "parent", "shift_labels", "token_index", "labels",
                    "old_logprobs", "advantages", "segment_id", "sample_position", "samples")})
            off += len(r.input_ids)
        rows.append(acc)
    return rows


def subtree_end(parent: list[int]) -> list[int]:
    """Pre-order layout: the last index inside each node's subtree."""
    end = list(range(len(parent)))
    for i in range(len(parent) - 1, -1, -1):
        if parent[i] >= 0 and end[i] > end[parent[i]]:
            end[parent[i]] = end[i]
    return end


def tree_block_mask(parent: list[int], device):
    """flex_attention BlockMask of the trie-ancestor relation (ancestor-or-self)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    end = torch.tensor(subtree_end(parent), device=device)

    def mask_mod(b, h, q, kv):
        return (kv <= q) & (q <= end[kv])
    n = len(parent)
    return create_block_mask(mask_mod, B=None, H=None, Q_LEN=n, KV_LEN=n, device=device)


def flex_engine_class():
    from services.trainer.engine import Engine, _decoder

    class FlexEngine(Engine):
        """The trainer's Engine with the tree forward through flex_attention."""

        def row_hidden(self, row, tree=None):
            import torch

            if not (self.cfg.tree if tree is None else tree):
                return super().row_hidden(row, tree)
            dev = self.device
            ids = torch.tensor([row.input_ids], device=dev)
            pos = torch.tensor([row.position_ids], device=dev)
            hidden = _decoder(self.model)(input_ids=ids, position_ids=pos, use_cache=False,
                                          attention_mask=tree_block_mask(row.parent, dev)).last_hidden_state[0]
            return hidden[torch.tensor(row.token_index, device=dev)]
    return FlexEngine


def build(model_path: str, gc: bool, device: str = "cuda", attn: str = "sdpa"):
    import torch
    from transformers import AutoModelForCausalLM

    from services.trainer.engine import Engine, EngineConfig
    from services.trainer.loss import LossConfig

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16,
                                                 attn_implementation=attn).to(device)
    model.config.use_cache = False
    if gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    cls = flex_engine_class() if attn == "flex_attention" else Engine
    return cls(model, opt, sched, EngineConfig(LossConfig(0.2, 0.2, 1.0, 2.0), autocast=torch.bfloat16))


def time_layout(engine, rows, tree: bool, steps: int, warmup: int) -> dict:
    import torch

    from services.trainer.packing import MicroBatch

    mb = MicroBatch(rows=rows, num_terms=sum(r.num_terms for r in rows))
    engine.cfg.tree = tree
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = engine.train_step([mb])
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return dict(step_s=statistics.median(times), loss=out["loss"],
                peak_mem_GiB=round(torch.cuda.max_memory_allocated() / 2**30, 1))


def run(a) -> list[dict]:
    import torch

    names = a.layouts.split(",")
    engines = {"sdpa": build(a.model, not a.no_gc)}
    if any(n.endswith("_flex") for n in names):
        engines["flex"] = build(a.model, not a.no_gc, attn="flex_attention")
    n_params = sum(p.numel() for p in engines["sdpa"].model.parameters())
    samples = make_samples(a.groups, a.group_size, a.prompt, a.completion, engines["sdpa"].model.config.vocab_size)
    tokens = sum(len(s) for s in samples)
    tree, packed = tree_rows(samples, a.group_size), plain_rows(samples, a.group_size)
    layouts = {"tree": (tree, True, "sdpa"), "packed": (packed, True, "sdpa"), "padded": (tree, False, "sdpa"),
               "tree_flex": (tree, True, "flex"), "packed_flex": (packed, True, "flex")}
    out = []
    for name in names:
        rows, is_tree, eng = layouts[name]
        computed = sum(len(r.input_ids) for r in rows) if is_tree else tokens
        try:
            t = time.perf_counter()
            r = time_layout(engines[eng], rows, is_tree, a.steps, a.warmup)
            r["wall_s"] = round(time.perf_counter() - t, 1)  # warm-up (compiles) included
        except Exception as exc:  # noqa: BLE001  (OOM, compile failure: recorded, next layout)
            r = dict(error=f"{type(exc).__name__}: {str(exc)[:160]}")
            torch.cuda.empty_cache()
        if "step_s" in r:
            r.update(tokens_per_s=round(tokens / r["step_s"]), mfu=round(6 * n_params * tokens / r["step_s"] / PEAK, 3),
                     hw_mfu=round(6 * n_params * computed / r["step_s"] / PEAK, 3), step_s=round(r["step_s"], 3))
        row = dict(label=a.label, layout=name, params_M=round(n_params / 1e6), tokens=tokens,
                   computed_tokens=computed, groups=a.groups, group_size=a.group_size, prompt=a.prompt,
                   completion=a.completion, grad_ckpt=not a.no_gc, gpu=torch.cuda.get_device_name(), **r)
        print("[train]", json.dumps(row), flush=True)
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--label", default="model")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--completion", type=int, default=512)
    ap.add_argument("--layouts", default="tree,packed,padded")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-gc", action="store_true", help="gradient checkpointing off")
    ap.add_argument("--results")
    ap.add_argument("--table")
    a = ap.parse_args()
    if a.table:
        return print_table(a.table)
    rows = run(a)
    if a.results:
        with open(a.results, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


def print_table(path: str) -> int:
    rows = [json.loads(x) for x in open(path) if x.strip()]
    print(f"{'model':<12}{'layout':>8}{'tokens':>8}{'computed':>9}{'step s':>8}{'tokens/s':>10}"
          f"{'MFU':>7}{'hw MFU':>8}{'peak GiB':>9}")
    for r in rows:
        print(f"{r['label']:<12}{r['layout']:>8}{r['tokens']:>8}{r['computed_tokens']:>9}"
              f"{r.get('step_s', '-')!s:>8}{r.get('tokens_per_s', '-')!s:>10}{r.get('mfu', '-')!s:>7}"
              f"{r.get('hw_mfu', '-')!s:>8}{r.get('peak_mem_GiB', '-')!s:>9}  {r.get('error', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
