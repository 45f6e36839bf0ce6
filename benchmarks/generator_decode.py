"""generator_decode.py: the trainer's own generator per decode path, interleaved, one table.

  python benchmarks/generator_decode.py --model .cache/tiny-model/seed0
  python3 benchmarks/generator_decode.py --model /tmp/qwen2-0.5b --device cuda --dtype bfloat16   (a GPU)

Paths: `growing` (a cache that grows a token a step, finished rows pruned: the CPU default),
`fixed` (fixed-shape steps, static_decode.py, eager), `graphs` (the same replayed as CUDA
graphs: the GPU default). Each call generates `--prompts` prompts x `--n` completions of
`--tokens` tokens (no stop), as a vs_trl step does; the median of `--calls` calls per path.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--prompt-tokens", type=int, default=30)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--paths", default="growing,fixed,graphs", help="which paths to time (graphs: CUDA only)")
    a = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from agrpo.services.trainer.generation.generator import Generator, Request
    from agrpo.services.trainer.generation.sampling import SamplingParams

    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype)).to(a.device)
    paths = {"growing": Generator(model, set(), 4096, static=False), "fixed": Generator(model, set(), 4096, static=True)}
    paths["fixed"].graphs = False
    if a.device.startswith("cuda"):
        paths["graphs"] = Generator(model, set(), 4096, static=True)
    paths = {name: gen for name, gen in paths.items() if name in a.paths.split(",")}
    params = SamplingParams(max_tokens=a.tokens, n=a.n, ignore_eos=True)
    vocab = model.config.vocab_size

    def batch() -> list:
        return [Request(f"r{i}", [(7 * i + j) % vocab for j in range(a.prompt_tokens + i)], params)
                for i in range(a.prompts)]

    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    first = {}
    for name, gen in paths.items():  # the first call builds (and captures) what later calls reuse
        t = time.perf_counter()
        gen.generate(batch())
        sync()
        first[name] = time.perf_counter() - t
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(a.calls):
        for name, gen in paths.items():
            t = time.perf_counter()
            gen.generate(batch())
            sync()
            times[name].append(time.perf_counter() - t)
    print(f"{a.model} on {a.device} ({a.dtype}): {a.prompts} x {a.n} completions of {a.tokens} tokens a call")
    print("| path | first call (s) | median call (ms) | ms per decode step | graphs in use |")
    print("|---|---|---|---|---|")
    for name, gen in paths.items():
        median = statistics.median(times[name]) * 1000
        print(f"| {name} | {first[name]:.2f} | {median:.1f} | {median / a.tokens:.2f} | {gen.graphs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
