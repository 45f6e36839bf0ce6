"""gpu_mismatch.py: the trainer/vLLM logprob mismatch on one GPU, with and without an fp32 LM head.

On the device, scripts/gpu/run_mismatch.sh builds the model, starts vLLM and runs this:

    python3 benchmarks/gpu_mismatch.py --url http://127.0.0.1:PORT --served NAME --model DIR --tokenizer TOK

vLLM (bf16) samples `--prompts` groups of `--n` completions with their logprobs, the behaviour
logprobs rollout sends. The trainer's Engine scores the same tokens through its training path
(fp32 master weights, bf16 autocast, the tree forward) twice: with the bf16 LM head, and with
`cast_lm_head_to_fp32`. Both use the same weights and the same tokens, at the same step, so
what is left is numerics alone, with no staleness. For each sampling temperature it prints
the k3 KL mean and max (the trainer's `mismatch/k3_kl_*`), the mean |delta logp|, and vLLM's
mean -logp of the sampled tokens, which measures how sharp the distributions are.

The model is random: no real model fits what travels to the device. A random model's next-token
distributions are nearly flat, and a trained model's are sharp. Lower temperatures stand in for
that sharpness: logits / T, where bf16's rounding of the logits is scaled by 1/T too.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sample(url: str, served: str, prompt: list[int], n: int, max_tokens: int, temperature: float, seed: int):
    """n completions of one prompt: (token ids, vLLM's logprobs) each."""
    body = {"model": served, "prompt": prompt, "n": n, "max_tokens": max_tokens, "temperature": temperature,
            "logprobs": 0, "return_token_ids": True, "seed": seed, "ignore_eos": True}
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        choices = json.loads(resp.read())["choices"]
    return [(c["token_ids"], c["logprobs"]["token_logprobs"]) for c in choices]


def group_row(prompt: list[int], completions, gid: int):
    """One prefix-tree row of a group, as the trainer packs it; old_logprobs are vLLM's."""
    from agrpo.services.trainer.packing import TreeRow
    from agrpo.services.trainer.sample import Sample

    row = TreeRow()
    for i, (ids, logps) in enumerate(completions):
        row.add(Sample(sample_id=f"g{gid}s{i}", group_id=f"g{gid}", prompt_key=(gid, 0), policy_version=0,
                       input_ids=prompt + list(ids), completion_mask=[0] * len(prompt) + [1] * len(ids),
                       behavior_logprobs=[0.0] * len(prompt) + list(logps), advantage=0.0,
                       prompt_length=len(prompt)))
    return row.pack()


def mismatch(engine, rows, temperature: float, fp32_head: bool) -> dict:
    """k3 KL mean and max, mean |delta logp| between the Engine's logprobs and vLLM's."""
    import torch

    engine.cfg.fp32_head = fp32_head
    engine.cfg.loss.temperature = temperature
    k3s, deltas = [], []
    with torch.no_grad():
        for row in rows:
            logp, _ = engine.row_logprobs(row)
            old = torch.tensor(row.old_logprobs, device=logp.device, dtype=torch.float64)
            d = logp.double() - old
            k3s.append(torch.expm1(d) - d)
            deltas.append(d.abs())
    k3, delta = torch.cat(k3s), torch.cat(deltas)
    return {"k3_mean": float(k3.mean()), "k3_max": float(k3.max()), "abs_dlogp_mean": float(delta.mean()),
            "terms": int(k3.numel())}


def build(model: str, tokenizer: str):
    from agrpo.services.common.config import AgrpoConfig
    from agrpo.services.trainer.engine_factory import build_engine

    cfg = AgrpoConfig(model=model, tokenizer=tokenizer, bf16=True, dtype="float32", gradient_checkpointing=False,
                      trainer={"compile": False})
    engine, _, _ = build_engine(cfg, model)
    engine.model.eval()
    return engine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--served", required=True, help="vLLM's served model name")
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperatures", default="1.0,0.5,0.25,0.125")
    p.add_argument("--results", type=Path, default=None, help="append one JSON line per row here")
    a = p.parse_args(argv)
    engine = build(a.model, a.tokenizer)
    vocab = engine.model.get_output_embeddings().weight.shape[0]
    rng = random.Random(0)
    lines = ["| T | vLLM mean -logp | head | k3 mean | k3 max | mean abs dlogp | terms |",
             "|---|---|---|---|---|---|---|"]
    for temperature in [float(t) for t in a.temperatures.split(",")]:
        prompts = [[rng.randrange(4, vocab) for _ in range(a.prompt_len)] for _ in range(a.prompts)]
        groups = [sample(a.url, a.served, pr, a.n, a.max_tokens, temperature, seed=k) for k, pr in enumerate(prompts)]
        rows = [group_row(pr, g, k) for k, (pr, g) in enumerate(zip(prompts, groups))]
        sharp = statistics.fmean(-x for g in groups for _, logps in g for x in logps)
        for fp32_head in (False, True):
            r = {"temperature": temperature, "vllm_mean_neg_logp": sharp, "fp32_head": fp32_head,
                 **mismatch(engine, rows, temperature, fp32_head)}
            lines.append(f"| {temperature:g} | {sharp:.2f} | {'fp32' if fp32_head else 'bf16'} | "
                         f"{r['k3_mean']:.2e} | {r['k3_max']:.2e} | {r['abs_dlogp_mean']:.2e} | {r['terms']} |")
            print(lines[-1], flush=True)
            if a.results:
                with a.results.open("a") as f:
                    f.write(json.dumps(r) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
