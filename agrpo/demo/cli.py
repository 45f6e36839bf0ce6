"""`agrpo demo`: train the tiny model (or SmolLM2) with the whole system on this machine.

Run: make demo   (or: .venv/bin/agrpo demo --steps 40)
On NVIDIA GPUs: agrpo demo --gpu (two GPUs: vLLM on GPU 0, trainer on GPU 1, NCCL weight sync;
one GPU: both on it, CUDA IPC weight sync; docs/gpu.md "Full loop on two GPUs", "One GPU").
Writes <out>/metrics.jsonl, <out>/curves.png, <out>/summary.json and <out>/logs/.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def _gpu_options(a: argparse.Namespace):
    from agrpo.launcher.gpus import gpu_count

    from .gpu import GpuOptions, default_trainer_gpu

    if not a.gpu:
        return None
    ext = None if a.worker_extension.lower() in ("", "none") else a.worker_extension
    trainer_gpu = a.trainer_gpu if a.trainer_gpu is not None else default_trainer_gpu(a.vllm_gpu, gpu_count())
    return GpuOptions(vllm_gpu=a.vllm_gpu, trainer_gpu=trainer_gpu,
                      gpu_memory_utilization=a.gpu_memory_utilization, kv_cache_gib=a.kv_cache_gib,
                      worker_extension=ext, dtype=a.dtype)


def parse_sets(items: list[str]) -> dict:
    """["trainer.weight_load=vllm", "max_staleness=1"] -> nested dict (values read as YAML)."""
    import yaml

    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set wants KEY=VALUE, got {item!r}")
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return out


def parse(argv: list[str]):
    """Demo options from the command line."""
    from agrpo.launcher.vllm_process import WORKER_EXTENSION

    from .runner import DemoOptions

    p = argparse.ArgumentParser(prog="agrpo demo", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["tiny", "smollm2", "0.5b", "1.5b"], default="tiny",
                   help="tiny: random 0.5M model, digit-share reward; smollm2: SmolLM2-135M, one-digit sums; "
                        "0.5b, 1.5b: random models in Qwen2.5's shapes, digit-share (for a GPU)")
    p.add_argument("--model-path", type=Path, default=None,
                   help="any HF model folder (tokenizer with a chat template) instead; --model picks the task")
    p.add_argument("--task", choices=["auto", "digits", "sums", "word-problems"], default="auto",
                   help="auto: the model's own (smollm2: sums; the others: digits); digits: sums up to 50, rewarded "
                        "by the share of digits written; sums: one-digit sums, the right answer; word-problems: "
                        "1-4 step arithmetic word problems, the right answer (256 tokens)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 80; smollm2: 20)")
    p.add_argument("--epochs", type=float, default=None, help="train this many epochs instead of --steps")
    p.add_argument("--num-prompts", type=int, default=64, help="prompts in the (generated) dataset")
    p.add_argument("--learning-rate", type=float, default=None)
    p.add_argument("--max-staleness", type=int, default=2, help="policy versions a trained sample may lag")
    p.add_argument("--out", type=Path, default=Path("demo_output"))
    p.add_argument("--cache", type=Path, default=Path(".cache"))
    p.add_argument("--timeout", type=float, default=1800, help="give up after this many seconds")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config key for every service, e.g. --set trainer.weight_load=vllm (repeatable)")
    g = p.add_argument_group("GPU mode (NVIDIA GPUs)")
    g.add_argument("--gpu", action="store_true",
                   help="vLLM and the trainer on GPUs: NCCL weight sync on two, CUDA IPC on one")
    g.add_argument("--vllm-gpu", default="0", help="CUDA device of vLLM (default 0)")
    g.add_argument("--trainer-gpu", default=None,
                   help="CUDA device of the trainer (default: another GPU, or vLLM's own on a one-GPU machine)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.25, help="vLLM's share of its GPU")
    g.add_argument("--kv-cache-gib", type=float, default=None,
                   help="vLLM's KV cache (default: room for max_inflight_tasks full-length sequences, at least "
                        "2 GiB; 0: what --gpu-memory-utilization leaves)")
    g.add_argument("--worker-extension", default=WORKER_EXTENSION,
                   help="vLLM --worker-extension-cls; 'none' leaves the flag out")
    g.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                   help="dtype the trainer loads the model in (bf16 autocast either way)")
    a = p.parse_args(argv)
    try:
        gpu, overrides = _gpu_options(a), parse_sets(a.set)
    except ValueError as exc:
        p.error(str(exc))
    steps = a.steps or (20 if a.model == "smollm2" else 80)
    return DemoOptions(model=a.model, task=a.task, steps=steps, num_prompts=a.num_prompts, epochs=a.epochs,
                       out=a.out.resolve(), cache=a.cache.resolve(), learning_rate=a.learning_rate,
                       timeout_s=a.timeout, max_staleness=a.max_staleness, model_path=a.model_path, gpu=gpu,
                       overrides=overrides)


def main(argv: list[str]) -> int:
    """Run the demo; print its summary; 0 on success."""
    from agrpo.services.common.config import ConfigError
    from agrpo.services.common.preflight import INTERRUPTED_EXIT

    from .runner import run

    opts = parse(argv)
    # SIGTERM unwinds like Ctrl-C, so the runner's cleanup stops every child process.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        result = run(opts)
    except KeyboardInterrupt:
        print("\n[demo] interrupted: every process it started has been stopped")
        return INTERRUPTED_EXIT
    except ConfigError as exc:  # a typo in --set or an AGRPO_* variable, found before vLLM starts
        print(f"[demo] config error: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"\n[demo] failed: {exc}\n[demo] logs: {opts.out / 'logs'}", file=sys.stderr)
        return 1
    from .report import closing_lines

    print()
    for line in closing_lines(result):
        print(line)
    print(f"[demo] plot: {result['plot']}; metrics: {opts.out / 'metrics.jsonl'}; summary: {opts.out / 'summary.json'}")
    return 0
