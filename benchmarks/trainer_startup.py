"""trainer_startup.py: where a trainer process's seconds go before its first step, phase by phase,
in one fresh process (the order the trainer does them; each phase's time includes the imports
it triggers).

  python3 benchmarks/trainer_startup.py --model /tmp/agrpo-cache/shaped-model/1.5b --device cuda
  .venv/bin/python benchmarks/trainer_startup.py --model .cache/tiny-model/seed0 --device cpu

Phases: import torch; CUDA context (device init, first allocation); import transformers'
model classes; from_pretrained (to the CPU) and the copy to the device; the optimizer; the
generator's copy of the model (weight_transport local); the first decode batch (prefill and
24 tokens for 16 sequences: CUDA graph capture on a GPU); the first and the second train step
of a 16-sample tree row. Prints one row per phase (seconds) and the total.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Clock:
    """Named laps, printed as a table at the end."""

    def __init__(self) -> None:
        self.t = time.perf_counter()
        self.laps: list[tuple[str, float]] = []

    def lap(self, name: str, sync=None) -> None:
        if sync is not None:
            sync()
        now = time.perf_counter()
        self.laps.append((name, now - self.t))
        self.t = now

    def table(self) -> str:
        rows = [f"| {name} | {secs:.2f} |" for name, secs in self.laps]
        total = sum(s for _, s in self.laps)
        return "\n".join(["| phase | s |", "|---|---|", *rows, f"| **total** | **{total:.2f}** |"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    a = ap.parse_args()
    clock = Clock()
    import torch

    clock.lap("import torch")
    device = torch.device(a.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    torch.empty(1, device=device)
    clock.lap("device context", sync)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    clock.lap("import transformers")
    dtype = getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    clock.lap("from_pretrained (CPU)")
    model = model.to(device).train()
    clock.lap("to device", sync)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.type == "cuda" or None)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    clock.lap("optimizer")
    engine = _engine(model, optimizer, scheduler, device)
    clock.lap("engine (imports)")
    generator = _generator(model, tokenizer)
    clock.lap("generator copy", sync)
    _decode(generator, tokenizer)
    clock.lap("first decode batch", sync)
    _decode(generator, tokenizer)
    clock.lap("second decode batch", sync)
    mb = _batch(model.config.vocab_size)
    engine.train_step([mb])
    clock.lap("first train step", sync)
    engine.train_step([mb])
    clock.lap("second train step", sync)
    print(f"trainer start-up, {a.model} on {device} ({a.dtype})")
    print(clock.table())
    return 0


def _engine(model, optimizer, scheduler, device):
    import torch

    from agrpo.services.trainer.engine import Engine, EngineConfig
    from agrpo.services.trainer.loss import LossConfig

    autocast = torch.bfloat16 if device.type == "cuda" else None
    return Engine(model, optimizer, scheduler, EngineConfig(LossConfig(0.2, 0.2), tree=device.type == "cuda",
                                                            autocast=autocast, compile_layers=False,
                                                            compile_head=False, device=device))


def _generator(model, tokenizer):
    from agrpo.services.trainer.generation.generator import Generator

    return Generator(model, {tokenizer.eos_token_id or 0}, 1024)


def _decode(generator, tokenizer) -> None:
    """16 completions of 24 tokens for 2 prompts, as the demo asks (the generator's batch call)."""
    from agrpo.services.trainer.generation.generator import Request
    from agrpo.services.trainer.generation.sampling import SamplingParams

    prompts = [tokenizer.encode("1 + 2 =") or [1], tokenizer.encode("3 + 4 =") or [1]]
    params = SamplingParams(max_tokens=24, temperature=1.0, n=8, ignore_eos=True)
    generator.generate([Request(request_id=f"r{i}", prompt=p, params=params) for i, p in enumerate(prompts)])


def _batch(vocab: int):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_train_throughput as g

    samples = g.make_samples(2, 8, 32, 24, vocab)
    return g.micro_batch(g.tree_rows(samples, 16))


if __name__ == "__main__":
    raise SystemExit(main())
