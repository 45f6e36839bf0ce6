"""gpu_trainer_memory.py: the trainer's engine as the service builds it, per memory mode, on one GPU.

  python3 scripts/gpu/make_tiny.py /tmp/q15 /tmp/q15tok --preset qwen2-1.5b --device cuda
  python3 benchmarks/gpu_trainer_memory.py --model /tmp/q15 --tokenizer /tmp/q15tok \
      --modes plain,fsdp,bf16,offload --results mem.jsonl
  python3 benchmarks/gpu_trainer_memory.py --table mem.jsonl

Each mode runs in its own process and builds its engine through `ranks.build` (what the
trainer service does at start: the model from a folder, FSDP2 when the config asks for it,
the optimizer, the tree path on CUDA, compiled layers), then times `train_step` on one
GRPO-shaped micro-batch (`--groups` x `--group-size` samples, a shared `--prompt`-token
prompt, `--completion`-token completions). Modes (config keys in brackets):

  plain    today's path: fp32 master weights, bf16 autocast, fp32 AdamW (dtype float32)
  fsdp     the same under FSDP2 on one rank (trainer.fsdp): the multi-rank code path
  bf16     bf16 weights and bf16 AdamW state (dtype bfloat16): half the memory; updates
           smaller than a weight's bf16 resolution (~0.4%) are lost
  offload  fsdp + FSDP2 CPU offload (trainer.cpu_offload): weights, gradients and AdamW
           state in pinned CPU memory, the optimizer steps on CPU
  lora     a LoRA adapter, r 16 on every linear layer (peft), over frozen bf16 base weights
           (dtype bfloat16): gradients and AdamW state for the adapter alone
  lora_fp32  the same over fp32 base weights (dtype float32, bf16 autocast)

`peak_GiB` is torch.cuda.max_memory_allocated over the timed steps; `static_GiB` the
memory held between steps (weights, gradients, optimizer state).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = {
    "plain": {"dtype": "float32", "trainer": {}},
    "fsdp": {"dtype": "float32", "trainer": {"fsdp": True}},
    "bf16": {"dtype": "bfloat16", "trainer": {}},
    "bf16_fsdp": {"dtype": "bfloat16", "trainer": {"fsdp": True}},
    "offload": {"dtype": "float32", "trainer": {"cpu_offload": True}},
    "lora": {"dtype": "bfloat16", "trainer": {}, "peft": True},
    "lora_fp32": {"dtype": "float32", "trainer": {}, "peft": True},
}
LORA = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}


def one_mode(a) -> dict:
    """Build and time one mode in this process."""
    import torch

    from agrpo.services.common.config import AgrpoConfig
    from agrpo.services.trainer import ranks
    from benchmarks.gpu_train_throughput import make_samples, micro_batch, tree_rows

    over = MODES[a.mode]
    cfg = AgrpoConfig(model=a.model, tokenizer=a.tokenizer, dtype=over["dtype"], gradient_checkpointing=True,
                      learning_rate=1e-6, trainer={"compile": not a.no_compile, **over["trainer"]},
                      peft=LORA if over.get("peft") else None)
    cuda = torch.cuda.is_available()  # CPU: a smoke run of the script (memory columns 0)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    world = ranks.World()
    ranks.init(world, 600, cuda, ranks.sharded(cfg))
    t0 = time.perf_counter()
    engine = ranks.build(cfg, a.model, None, world)[0]
    build_s = time.perf_counter() - t0
    vocab = engine.model.get_input_embeddings().num_embeddings
    n_params = sum(p.numel() for p in engine.model.parameters())
    trained = sum(p.numel() for p in engine.model.parameters() if p.requires_grad)
    samples = make_samples(a.groups, a.group_size, a.prompt, a.completion, vocab)
    mb = micro_batch(tree_rows(samples, a.group_size))
    tokens = sum(len(s) for row in mb.rows for s in row.samples)
    times = []
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            sync()
            static = torch.cuda.memory_allocated() if cuda else 0
            if cuda:
                torch.cuda.reset_peak_memory_stats()
        sync()
        t = time.perf_counter()
        stats = engine.train_step([mb])
        sync()
        times.append(time.perf_counter() - t)
    step = statistics.median(times[a.warmup:])
    return dict(mode=a.mode, params_M=round(n_params / 1e6), trained_M=round(trained / 1e6, 1), tokens=tokens, build_s=round(build_s, 1),
                first_step_s=round(times[0], 1), step_s=round(step, 3), tokens_per_s=round(tokens / step),
                static_GiB=round(static / 2**30, 1), peak_GiB=round(torch.cuda.max_memory_allocated() / 2**30 if cuda else 0, 1),
                loss=stats["loss"], compile=not a.no_compile, gpu=torch.cuda.get_device_name() if cuda else "cpu")


def run_all(a) -> int:
    """Each mode in a fresh process (clean memory, its own process group)."""
    for mode in a.modes.split(","):
        argv = [sys.executable, __file__, "--one", "--mode", mode, "--model", a.model, "--tokenizer", a.tokenizer or a.model,
                "--groups", str(a.groups),
                "--group-size", str(a.group_size), "--prompt", str(a.prompt), "--completion", str(a.completion),
                "--steps", str(a.steps), "--warmup", str(a.warmup)] + (["--no-compile"] if a.no_compile else [])
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=a.limit_s, check=False)
            lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
            row = json.loads(lines[-1]) if lines else {"mode": mode, "error": (out.stderr.strip().splitlines()
                                                                              or ["no output"])[-1][:300]}
        except subprocess.TimeoutExpired:
            row = {"mode": mode, "error": f"timeout after {a.limit_s} s"}
        row["model"] = Path(a.model).name
        print(json.dumps(row), flush=True)
        if a.results:
            with open(a.results, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


def print_table(path: str) -> int:
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    cols = ["model", "mode", "params_M", "trained_M", "tokens_per_s", "step_s", "static_GiB", "peak_GiB", "first_step_s", "error"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--tokenizer", help="tokenizer folder (default: the model's)")
    ap.add_argument("--modes", default="plain,fsdp,bf16,offload")
    ap.add_argument("--mode", choices=sorted(MODES))
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--completion", type=int, default=512)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--limit-s", type=int, default=300)
    ap.add_argument("--results")
    ap.add_argument("--table")
    a = ap.parse_args()
    if a.table:
        return print_table(a.table)
    if a.one:
        print(json.dumps(one_mode(a)), flush=True)
        return 0
    return run_all(a)


if __name__ == "__main__":
    sys.exit(main())
