"""gpu_train_throughput.py: trainer tokens/s and MFU on one GPU, prefix tree vs plain packing.

  python3 benchmarks/gpu_train_throughput.py --model preset:qwen2-1.5b --label qwen2-1.5b \
      --layouts tree,packed,tree_sdpa,tree+eager --results train.jsonl --profile tree
  python3 benchmarks/gpu_train_throughput.py --table train.jsonl

A GRPO-shaped step: `--groups` groups of `--group-size` samples sharing a random prompt,
one group per packed row (one micro-batch), through the trainer's own Engine
(services/trainer/engine.py: chunked-vocab logprobs, clipped GRPO loss, fused AdamW),
bf16 weights (`--dtype float32`: fp32 master weights, as a `dtype: float32` trainer holds them)
+ bf16 autocast, gradient checkpointing on. `--model` is a saved model or
`preset:<name>` (scripts/gpu/make_tiny.py's shapes, random weights built on the GPU).

Layouts of the same samples (suffixes combine: `tree+noch+v65536`):
  tree     the trainer's prefix-tree rows (packing.TreeRow) through the Engine's CUDA path:
           flex_attention with the trie BlockMask (services/trainer/tree_attention.py),
           decoder layers and logprob head torch.compile'd (EngineConfig defaults)
  tree2/3  the same with completions 37 shorter / 61 longer: new row lengths
  packed   plain padding-free packing: the same samples back to back in one row, each
           its own chain (block-diagonal causal), same path as tree: no sharing
  tree1 / packed1  all groups in one row: what the single-process trainer's batcher makes of
           this batch when its token budget holds it (one forward per step, not one per group)
  padded   the Engine's unpacked path: one padded row per sample (SDPA)
  *_sdpa   the pre-flex path: tree attention as a dense [N, N] mask to SDPA, nothing compiled
  +eager   flex attention only (layers and head eager); +nocl / +noch: one of them eager
  +v<N>    vocab chunk N for the logprob head (default 32768)
  +gc<K>   gradient checkpointing on every K-th decoder layer only (gc0: off; default all)
  +<other> ignored: a second timing of the same layout (e.g. tree+r)
`graphs` counts the dynamo graphs compiled while warming / timing a layout. `step_tflop` is the
model FLOPs the step must do (`step_flops`); `--table` prints tree / plain packing of the same
rows as a speed ratio next to that FLOP ratio, its bound.
tokens/s counts the samples' tokens (what the step trains on); MFU = 6 * params *
tokens / time / peak (989 TFLOP/s dense bf16, H200 SXM datasheet), attention FLOPs
left out, so the tree's MFU can exceed what the GPU computed (it skips the repeats):
`computed_tokens` is what went through the model, `hw_mfu` uses it.

Every layout is warmed (compiled) first, then all are timed: `compile_s` is the first
step's time over the timed median. `--barrier DIR --barrier-count K` lets K processes
(one per model) compile at the same time and then time one after another (a lock in
DIR), so one GPU call pays the compiles once in wall time and no timing overlaps work.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import random
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PEAK = 989e12


def make_samples(groups: int, size: int, prompt: int, completion: int, vocab: int, seed: int = 0):
    from agrpo.services.trainer.sample import Sample

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
    from agrpo.services.trainer.packing import TreeRow

    rows = []
    for k in range(0, len(samples), per_row):
        row = TreeRow()
        for s in samples[k:k + per_row]:
            row.add(s)
        rows.append(row.pack())
    return rows


def plain_rows(samples, per_row: int):
    """Padding-free packing without sharing: each sample a separate chain in the row."""
    rows = []
    for k in range(0, len(samples), per_row):
        acc = None
        for slot, row in enumerate(tree_rows(samples[k:k + per_row], 1)):
            off = 0 if acc is None else acc.num_tokens
            r = replace(row, parent=[p + off if p >= 0 else -1 for p in row.parent],
                        subtree_end=[e + off for e in row.subtree_end],
                        token_index=[t + off for t in row.token_index], segment_id=[slot] * len(row.segment_id))
            acc = r if acc is None else replace(acc, **{f: getattr(acc, f) + getattr(r, f) for f in (
                "input_ids", "position_ids", "parent", "subtree_end", "shift_labels", "token_index", "labels",
                "old_logprobs", "advantages", "segment_id", "sample_position", "samples")})
        rows.append(acc)
    return rows


def step_flops(cfg, rows, tree: bool, gc: bool = True) -> float:
    """Model FLOPs one training step must do for `rows`, attention and the head included: the
    work a perfect set of kernels would do, so tree/packed FLOPs bound their speed ratio.

    Per token, the decoder's matmuls (2 x weights) run forward, backward (2x) and, with
    checkpointing, forward again; per attended (q, kv) pair, 4 x heads x head_dim per layer
    forward, 2.5x that backward; per loss term, the LM head (2 x hidden x vocab) forward,
    backward (2x), its chunk recompute and the entropy pass (1x each).
    """
    h, inter, layers, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    hd = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    q_dim, kv_dim = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    per_token = 2 * layers * (2 * h * q_dim + 2 * h * kv_dim + 3 * h * inter)
    per_pair = 4 * q_dim * layers
    tokens = pairs = terms = 0
    for row in rows:
        terms += row.num_terms
        if tree:  # kv is seen by the queries kv..subtree_end[kv]
            tokens += row.num_tokens
            pairs += sum(end - kv + 1 for kv, end in enumerate(row.subtree_end))
        else:
            tokens += sum(len(s) for s in row.samples)
            pairs += sum(len(s) * (len(s) + 1) // 2 for s in row.samples)
    redo = 1 if gc else 0
    return per_token * tokens * (3 + redo) + per_pair * pairs * (3.5 + redo) + 2 * h * vocab * terms * 5


def parse_layout(spec: str) -> tuple[str, tuple[str, bool, bool], dict]:
    """'tree+noch+v65536+gc2' -> (base, engine key (attention, compile layers, compile head), step options)."""
    base, *mods = spec.split("+")
    sdpa, eager = base.endswith("_sdpa"), "eager" in mods
    key = ("sdpa" if sdpa else "flex", not (sdpa or eager or "nocl" in mods), not (sdpa or eager or "noch" in mods))
    opts = dict(chunk=next((int(m[1:]) for m in mods if m[:1] == "v" and m[1:].isdigit()), 32768),
                gc_every=next((int(m[2:]) for m in mods if m[:2] == "gc" and m[2:].isdigit()), 1))
    return base.removesuffix("_sdpa"), key, opts


def load_model(model: str, device: str = "cuda", dtype: str = "bfloat16"):
    import torch
    from transformers import AutoModelForCausalLM

    if not model.startswith("preset:"):
        return AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype),
                                                    attn_implementation="sdpa").to(device)
    import importlib.util

    from transformers import Qwen2Config, Qwen2ForCausalLM

    spec = importlib.util.spec_from_file_location("make_tiny", ROOT / "scripts" / "gpu" / "make_tiny.py")
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    cfg = Qwen2Config(bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="sdpa",
                      **tiny.PRESETS[model.removeprefix("preset:")])
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(cfg).to(getattr(torch, dtype))


def build(model_path: str, gc: bool, device: str = "cuda", attention: str = "auto", compile_layers: bool = True,
          compile_head: bool = True, dtype: str = "bfloat16"):
    import torch

    from agrpo.services.trainer.engine import Engine, EngineConfig
    from agrpo.services.trainer.loss import LossConfig

    model = load_model(model_path, device, dtype)
    model.config.use_cache = False
    if gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    return Engine(model, opt, sched, EngineConfig(LossConfig(0.2, 0.2, 1.0, 2.0), autocast=torch.bfloat16,
                                                  attention=attention, compile_layers=compile_layers,
                                                  compile_head=compile_head))


def step_times(engine, mb, tree: bool, opts: dict, n: int) -> tuple[list[float], dict]:
    """n synchronised train_step wall times and the last step's stats."""
    import torch

    engine.cfg.tree, engine.cfg.vocab_chunk = tree, opts["chunk"]
    for i, layer in enumerate(engine.model.base_model.layers):
        layer.gradient_checkpointing = bool(opts["gc_every"]) and i % opts["gc_every"] == 0
    times, out = [], {}
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = engine.train_step([mb])
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return times, out


def perf_mfu(model, rows, tree: bool, opts: dict, step: float) -> dict:
    """perf/mfu and perf/hfu as the trainer logs them (services/trainer/step_metrics.py)."""
    from agrpo.services.trainer.step_metrics import FlopModel, throughput

    layers = len(model.base_model.layers)
    every = opts["gc_every"]
    share = (len(range(0, layers, every)) / layers) if every and model.is_gradient_checkpointing else 0.0
    perf = throughput(FlopModel.of(model, tree=tree, recompute=share), [micro_batch(rows)],
                      [s for row in rows for s in row.samples], step, PEAK / 1e12)
    return dict(perf_mfu=round(perf["perf/mfu"], 3), perf_hfu=round(perf["perf/hfu"], 3))


def graphs() -> int:
    """Dynamo graphs compiled so far in this process."""
    import torch._dynamo.utils as du

    return du.counters["stats"]["unique_graphs"]


@contextmanager
def turn(barrier: str | None, label: str, count: int, wait_s: float = 300.0):
    """Wait (at most wait_s) until `count` processes have warmed up, then hold DIR/lock."""
    if not barrier:
        yield
        return
    folder = Path(barrier)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{label}.warm").touch()
    deadline = time.monotonic() + wait_s
    while len(list(folder.glob("*.warm"))) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def layout_rows(a, vocab: int) -> dict:
    """base layout -> (rows, tree flag); all from the same seed's samples."""
    samples = make_samples(a.groups, a.group_size, a.prompt, a.completion, vocab)
    tree = tree_rows(samples, a.group_size)
    other = {k: make_samples(a.groups, a.group_size, a.prompt, a.completion + d, vocab, seed=k)
             for k, d in ((2, -37), (3, 61))}
    return {"tree": (tree, True), "packed": (plain_rows(samples, a.group_size), True), "padded": (tree, False),
            "tree1": (tree_rows(samples, len(samples)), True), "packed1": (plain_rows(samples, len(samples)), True),
            **{f"tree{k}": (tree_rows(s, a.group_size), True) for k, s in other.items()}}


def mask_ms(row) -> float:
    """Median ms to build one row's BlockMask (padding and host->device copy included)."""
    import torch

    from agrpo.services.trainer import tree_attention as ta

    times = []
    for _ in range(10):
        torch.cuda.synchronize()
        t = time.perf_counter()
        _, _, end = ta.pad_tree(row.input_ids, row.position_ids, row.subtree_end, ta.padded_length(row.num_tokens))
        ta.block_mask(torch.tensor(end, device="cuda"))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e3, 2)


def profile_step(engine, mb, tree: bool, opts: dict, path: Path, title: str) -> None:
    """One profiled step: the top kernels/ops by device time, how busy the GPU was (the union of
    its kernels), its longest idle gaps with what the CPU ran meanwhile, and the Chrome trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from agrpo.services.trainer.profiling import idle_gaps

    step_times(engine, mb, tree, opts, 1)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = sum(step_times(engine, mb, tree, opts, 1)[0])
    avg = prof.key_averages()
    busy, gaps = idle_gaps(prof.events())
    with open(path, "a") as f:
        f.write(f"\n## {title}: step {wall:.3f} s (profiled), the GPU busy {busy:.3f} s of it\n")
        f.write(avg.table(sort_by="self_device_time_total", row_limit=35, max_name_column_width=60))
        f.write(f"\n### {title}: by CPU time\n")
        f.write(avg.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
        f.write(f"\n### {title}: the longest GPU idle gaps (ms, at ms into the step: what the CPU ran)\n")
        f.writelines(f"{ms:8.2f} at {at:7.1f}: {ops}\n" for ms, at, ops in gaps)
    prof.export_chrome_trace(str(path.with_suffix(".trace.json.gz")))  # gzipped by its name
    print(f"[profile] {title}: step {wall:.3f} s, GPU busy {busy:.3f} s; idle gaps (ms):",
          " ".join(f"{ms:.1f}" for ms, _, _ in gaps[:8]), flush=True)
    torch.cuda.synchronize()


def run(a, emit) -> None:
    """Warm every layout, then (in this process's turn) time each and `emit` its JSON row."""
    import torch

    specs = a.layouts.split(",")
    engines: dict = {}

    def engine(key: tuple[str, bool, bool]):
        if key not in engines:
            engines[key] = build(a.model, not a.no_gc, attention=key[0], compile_layers=key[1], compile_head=key[2],
                                 dtype=a.dtype)
        return engines[key]

    first = engine(parse_layout(specs[0])[1])
    n_params = sum(p.numel() for p in first.model.parameters())
    rows = layout_rows(a, first.model.config.vocab_size)
    results = {}
    for spec in specs:  # warm (compile) every layout first
        base, key, opts = parse_layout(spec)
        g0 = graphs()
        try:
            warm, _ = step_times(engine(key), micro_batch(rows[base][0]), rows[base][1], opts, a.warmup)
            results[spec] = dict(first_step_s=round(warm[0], 2), warm_graphs=graphs() - g0)
        except Exception as exc:  # noqa: BLE001  (OOM, compile failure: recorded, next layout)
            results[spec] = dict(error=f"{type(exc).__name__}: {str(exc)[:300]}")
            torch.cuda.empty_cache()
        print("[warm]", spec, json.dumps(results[spec]), flush=True)
    with turn(a.barrier, a.label, a.barrier_count):
        print("[mask]", a.label, "BlockMask of one tree row, ms:", mask_ms(rows["tree"][0][0]), flush=True)
        for spec in specs:
            emit(_timed(a, spec, engine, rows, results[spec], n_params))
        for spec in filter(None, (a.profile or "").split(",")):
            base, key, opts = parse_layout(spec)
            try:
                profile_step(engine(key), micro_batch(rows[base][0]), rows[base][1], opts,
                             Path(a.profile_out or f"{a.label}_profile.txt"), f"{a.label} {spec}")
            except Exception as exc:  # noqa: BLE001
                print("[profile]", spec, "failed:", repr(exc)[:300], flush=True)


def micro_batch(rows):
    """Packed rows as the batcher's micro-batch, with the counts the step metrics read."""
    from agrpo.services.trainer.packing import MicroBatch

    return MicroBatch(rows=rows, num_terms=sum(r.num_terms for r in rows),
                      num_forward_tokens=sum(r.num_tokens for r in rows),
                      num_samples=sum(len(r.samples) for r in rows),
                      load=[sum(d + 1 for d in r.position_ids) for r in rows])  # attended (q, kv) pairs


def _timed(a, spec: str, engine, rows, r: dict, n_params: int) -> dict:
    """Time one warmed layout; one JSON row with tokens/s, MFU and compile cost."""
    import torch

    base, key, opts = parse_layout(spec)
    lrows, tree = rows[base]
    tokens = sum(len(s) for row in lrows for s in row.samples)
    computed = sum(row.num_tokens for row in lrows) if tree else tokens
    try:
        if "error" in r:
            raise RuntimeError(r["error"])
        torch.cuda.reset_peak_memory_stats()
        g0 = graphs()
        times, stats = step_times(engine(key), micro_batch(lrows), tree, opts, a.steps)
        step = statistics.median(times)
        r.update(step_s=round(step, 3), steps_s=[round(t, 3) for t in times], loss=stats["loss"],
                 timed_graphs=graphs() - g0,
                 fwd_bwd_s=round(stats["perf/forward_backward_s"], 3), optim_s=round(stats["perf/optimizer_s"], 3),
                 compile_s=round(r["first_step_s"] - step, 1), tokens_per_s=round(tokens / step),
                 mfu=round(6 * n_params * tokens / step / PEAK, 3),
                 hw_mfu=round(6 * n_params * computed / step / PEAK, 3),
                 step_tflop=round(step_flops(engine(key).model.config, lrows, tree, not a.no_gc) / 1e12, 1),
                 **perf_mfu(engine(key).model, lrows, tree, opts, step),
                 peak_mem_GiB=round(torch.cuda.max_memory_allocated() / 2**30, 1))
    except Exception as exc:  # noqa: BLE001
        r.setdefault("error", f"{type(exc).__name__}: {str(exc)[:300]}")
        torch.cuda.empty_cache()
    row = dict(label=a.label, layout=spec, params_M=round(n_params / 1e6), tokens=tokens,
               computed_tokens=computed, groups=a.groups, group_size=a.group_size, prompt=a.prompt,
               completion=a.completion, grad_ckpt=not a.no_gc, dtype=a.dtype, gpu=torch.cuda.get_device_name(),
               torch=torch.__version__, **r)
    print("[train]", json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--label", default="model")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--completion", type=int, default=512)
    ap.add_argument("--layouts", default="tree,packed,padded")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-gc", action="store_true", help="gradient checkpointing off")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="the weights' dtype (float32: fp32 master weights under bf16 autocast)")
    ap.add_argument("--profile", help="layouts (comma-separated) to profile for one step after timing")
    ap.add_argument("--profile-out")
    ap.add_argument("--barrier", help="folder shared by processes that compile together, then time in turn")
    ap.add_argument("--barrier-count", type=int, default=1)
    ap.add_argument("--max-autotune", action="store_true",
                    help="inductor tries several flex_attention kernel configs (matmuls stay on cuBLAS)")
    ap.add_argument("--results")
    ap.add_argument("--table")
    a = ap.parse_args()
    if a.table:
        return print_table(a.table)
    if a.max_autotune:
        import torch._inductor.config as inductor

        inductor.max_autotune, inductor.max_autotune_gemm_backends = True, "ATEN"
    def emit(row: dict) -> None:
        if a.results:
            with open(a.results, "a") as f:
                f.write(json.dumps(row) + "\n")
    try:
        run(a, emit)
    finally:  # a process that failed early must not hold the others at the barrier
        if a.barrier:
            Path(a.barrier, f"{a.label}.warm").touch()
    return 0


def print_table(path: str) -> int:
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    cols = [("step_s", 7), ("tokens_per_s", 9), ("mfu", 6), ("hw_mfu", 7), ("perf_mfu", 8), ("perf_hfu", 8),
            ("compile_s", 8), ("warm_graphs", 6), ("timed_graphs", 6), ("peak_mem_GiB", 6), ("step_tflop", 6)]
    print(f"{'model':<11}{'layout':<18}{'tokens':>7}{'comp.':>7}" + "".join(f"{c[:8]:>{w + 1}}" for c, w in cols))
    for r in rows:
        print(f"{r['label']:<11}{r['layout']:<18}{r['tokens']:>7}{r['computed_tokens']:>7}"
              + "".join(f"{r.get(c, '-')!s:>{w + 1}}" for c, w in cols) + f"  {r.get('error', '')[:120]}")
    print("tree against plain packing of the same rows: speed ratio (step time) and FLOP ratio (step_tflop)")
    steps = {(r["label"], r["layout"]): r for r in rows if "step_s" in r}
    for (label, layout), r in steps.items():
        other = steps.get((label, layout.replace("tree", "packed", 1)))
        if layout.startswith("tree") and other and other is not r:
            flop = (f"{other['step_tflop'] / r['step_tflop']:.2f}" if r.get("step_tflop") and other.get("step_tflop")
                    else "-")
            print(f"  {label:<14}{layout:<10} {other['step_s'] / r['step_s']:.2f}x  (FLOPs {flop}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
