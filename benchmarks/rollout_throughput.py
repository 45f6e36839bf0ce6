"""Generation throughput through the rollout service vs a raw client, side by side.

Run (starts its own CPU vLLM on the tiny model; a few minutes):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rollout_throughput.py [--inflight 64,256,512] \
        [--G 8] [--max-tokens 64] [--prompt-tokens 0] [--waves 4] [--repeats 2]

Against a server already running (a GPU vLLM, or benchmarks/stub_vllm.py):

    ... --vllm-url http://127.0.0.1:8000 --model-dir /tmp/tiny [--tokenizer /tmp/tiny_tok]

For each `--inflight` value, `--repeats` times: raw, then service, on the same prompts.
Raw: an aiohttp client sends each prompt's G requests (n=1, the service's exact body)
straight to /inference/v1/generate, `inflight` at a time. `--paths` adds raw_group and
service_group: the same with a group's G completions in one request (n=G; the service with
`rollout.one_request_per_group`), `inflight` completions at a time. Service: the rollout service
in-process, with the real reward service and a stand-in trainer that acks at once
(both in a child process by default, as in a deployment: `--peers inproc` puts them in
this process); wall time runs from the end of start-up to the last group trained.
Each run has `waves` x inflight requests (or `--prompts` x G), so start and tail are
amortized; every run gets fresh prompts (no prefix-cache hits from the run before).
Columns: prompt (mean prompt tokens), tokens (completion tokens), wall s (to the last
sample trained), gen s (to the last completion from vLLM: wall - gen s is the scoring
and sending tail), tok/s and ratio (service/raw, from wall), in flight (client side,
mean/peak, sampled every 20 ms), vLLM r+w (mean running+waiting from its /metrics
every 0.5 s), scr ms (mean reward-service latency per group), drops.
CPU ceiling without vLLM: benchmarks/stub_vllm.py on one core (taskset -c 0), this on
the other (taskset -c 1, `--peers-cpus 0` to keep the reward service off it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "support")]
REWARD_FUNCS = [{"name": "rollout_test_rewards:distinct_tokens_reward"}]
PATHS = ("raw", "service", "raw_group", "service_group")


# Workload
def filler_words(tokenizer) -> list[str]:
    """Words that are one token each: the word-level vocabulary ("w4", ...) or tiny_model's words."""
    vocab = tokenizer.get_vocab()
    if "w4" in vocab:
        return [f"w{i}" for i in range(4, min(len(vocab), 1000)) if f"w{i}" in vocab]
    from agrpo.demo.tiny_model import WORDS

    return list(WORDS)


def padded_prompts(n: int, prompt_tokens: int, tokenizer, conversational: bool, salt: int = 0) -> list:
    """n prompts of about `prompt_tokens` tokens (0: short questions), padded with filler words;
    another `salt` gives other words (no prefix-cache hits across runs)."""
    from agrpo.services.rollout.data import render

    words = filler_words(tokenizer)

    def make(i: int, k: int):
        j0 = (i + salt * n) * 31
        text = f"What is {i} + {i % 7}?" + "".join(f" {words[(j0 + j) % len(words)]}" for j in range(k))
        return [{"role": "user", "content": text}] if conversational else text

    def length(i: int, k: int) -> int:
        return len(render(tokenizer, make(i, k), None)[0])

    k = 0
    if prompt_tokens > 0:
        base, probe = length(0, 0), length(0, 200)
        per_word = max((probe - base) / 200, 1e-3)
        k = max(0, round((prompt_tokens - base) / per_word))
        k = max(0, k + round((prompt_tokens - length(0, k)) / per_word))  # one correction
    return [make(i, k) for i in range(n)]


def write_dataset(path: Path, prompts: list) -> Path:
    with open(path, "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"prompt": p, "solution": str(i + i % 7)}) + "\n")
    return path


class Sampler:
    """A background task that appends a reading to `seen` every `every_s` while in a `with`."""

    def __init__(self, every_s: float) -> None:
        self.every_s, self.seen = every_s, []
        self.task: asyncio.Task | None = None

    async def _loop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.task = asyncio.get_running_loop().create_task(self._loop())
        return self

    def __exit__(self, *exc) -> None:
        self.task.cancel()


class InflightProbe(Sampler):
    """Samples a callable's value every `every_s`: peak and mean of what it saw."""

    def __init__(self, read, every_s: float = 0.02) -> None:
        super().__init__(every_s)
        self.read = read

    async def _loop(self) -> None:
        while True:
            self.seen.append(self.read())
            await asyncio.sleep(self.every_s)

    @property
    def peak(self) -> int:
        return max(self.seen, default=0)

    @property
    def mean(self) -> float:
        busy = [v for v in self.seen if v]
        return sum(busy) / len(busy) if busy else 0.0


class ServerQueue(Sampler):
    """vLLM's own view, from /metrics every `every_s`: mean requests running and waiting."""

    def __init__(self, url: str, every_s: float = 0.5) -> None:
        super().__init__(every_s)
        self.url = url

    async def _loop(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as s:
            while True:
                try:
                    async with s.get(self.url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                        self.seen.append(parse_queue(await r.text()))
                except (TimeoutError, aiohttp.ClientError):
                    pass
                await asyncio.sleep(self.every_s)

    def summary(self) -> str:
        busy = [(r, w) for r, w in self.seen if r or w]
        if not busy:
            return "-"
        return f"{sum(r for r, _ in busy) / len(busy):.0f}+{sum(w for _, w in busy) / len(busy):.0f}"


def parse_queue(text: str) -> tuple[float, float]:
    """(running, waiting) summed over engines, from vLLM's Prometheus text."""
    out = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out["vllm:num_requests_running"], out["vllm:num_requests_waiting"]


# The two paths
async def raw_client(url: str, model: str, prompt_ids: list[list[int]], args, inflight: int, n: int = 1) -> dict:
    """`inflight` completions at a time, `n` per request (1, or a whole group)."""
    import aiohttp

    from agrpo.services.rollout.vllm_client import SamplingConfig

    params = {**SamplingConfig(args.max_tokens, top_k=0, n=n).params(), "logprobs": 0}
    jobs = [(f"raw-{p}-{g}", ids) for p, ids in enumerate(prompt_ids) for g in range(args.G // n)]
    sem = asyncio.Semaphore(max(1, inflight // n))
    state = {"tokens": 0, "inflight": 0, "errors": 0}

    async def one(session, rid, ids):
        async with sem:
            state["inflight"] += n
            try:
                body = {"request_id": rid, "token_ids": ids, "sampling_params": params, "model": model}
                async with session.post(url + "/inference/v1/generate", json=body) as r:
                    if r.status != 200:  # counted and shown, not fatal: the sweep goes on
                        state["errors"] += 1
                        if state["errors"] == 1:
                            print(f"raw {rid}: HTTP {r.status}: {(await r.text())[:600]}", flush=True)
                        return
                    state["tokens"] += sum(len(c["token_ids"]) for c in (await r.json())["choices"])
            finally:
                state["inflight"] -= n

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=inflight + 8)) as s:
        await one(s, "raw-warm-up", prompt_ids[0])
        state["tokens"] = 0
        with InflightProbe(lambda: state["inflight"]) as probe, ServerQueue(url) as queue:
            t0 = time.perf_counter()
            await asyncio.gather(*(one(s, rid, ids) for rid, ids in jobs))
            wall = time.perf_counter() - t0
        if state["errors"]:
            print(f"raw at {inflight} in flight: {state['errors']} of {len(jobs)} requests failed", flush=True)
        return {"tokens": state["tokens"], "wall": wall, "gen_wall": wall, "probe": probe, "server": queue}


def service_config(url: str, args, data: Path, inflight: int, ports: tuple[int, int], grouped: bool = False):
    """Nothing caps the requests in flight below `inflight`: slots, credits, connector."""
    from agrpo.services.common.config import AgrpoConfig

    capacity = max(4096, 4 * inflight)
    return AgrpoConfig.model_validate({
        "model": args.model_dir, "tokenizer": args.tokenizer, "vllm_server_base_url": url,
        "dataset": {"path": "json", "data_files": str(data)}, "num_generations": args.G,
        "max_completion_length": args.max_tokens, "max_inflight_tasks": inflight, "num_train_epochs": 1,
        "queue_maxsize": capacity, "reward_funcs": REWARD_FUNCS, "trainer": {"port": ports[0]},
        "reward": {"port": ports[1]}, "log_level": "warning",
        "rollout": {"port": 0, "metrics_port": None, "scoring_concurrency": args.scoring_concurrency,
                    "one_request_per_group": grouped, "generate_endpoint": args.generate_endpoint}})


async def through_service(url: str, args, data: Path, num_prompts: int, inflight: int, peers,
                          grouped: bool = False) -> dict:
    from agrpo.services.rollout.server import build as build_rollout

    ports = await peers.new_trainer(max(4096, 4 * inflight))
    svc = await build_rollout(service_config(url, args, data, inflight, ports, grouped))
    tokens = 0
    on_sent = svc.app.on_sent

    def count(sample) -> None:
        nonlocal tokens
        tokens += len(sample.input_ids) - sample.prompt_length
        on_sent(sample)

    svc.app.on_sent = count
    await svc.start()
    app, last = svc.app, [0.0]
    on_latency = app.balancer.on_latency

    def completed(server_url: str, seconds: float) -> None:
        last[0] = time.perf_counter()
        on_latency(server_url, seconds)

    app.balancer.on_latency = completed
    with (InflightProbe(lambda: app.engine.inflight_requests if app.engine else 0) as probe,
          ServerQueue(url) as queue):
        t0 = time.perf_counter()
        while len(app.scheduler.done) < num_prompts:
            await asyncio.sleep(0.005)
        wall = time.perf_counter() - t0
    drops = dict(app.engine.drops)
    score = {x.name.rsplit("_", 1)[-1]: x.value for x in app.metrics.scoring_latency.collect()[0].samples}
    await svc.stop()
    return {"tokens": tokens, "wall": wall, "gen_wall": last[0] - t0, "probe": probe, "server": queue,
            "drops": drops, "score_ms": 1000 * score["sum"] / max(score["count"], 1)}


# The stand-in trainer and the reward service
class InprocPeers:
    """Reward service and FakeTrainer in this process (the old benchmark's set-up)."""

    async def start(self) -> InprocPeers:
        from agrpo.services.common.config import AgrpoConfig
        from agrpo.services.reward.server import build as build_reward

        self.reward = await build_reward(AgrpoConfig.model_validate(
            {"reward": {"port": 0, "metrics_port": None, "num_workers": 1}, "reward_funcs": REWARD_FUNCS}))
        self.reward_port = await self.reward.start()
        self.trainer = None
        return self

    async def new_trainer(self, capacity: int) -> tuple[int, int]:
        from fake_trainer import FakeTrainer

        if self.trainer:
            await self.trainer.stop()
        self.trainer = FakeTrainer(queue_maxsize=capacity, max_staleness=4)
        return await self.trainer.start(), self.reward_port

    async def stop(self) -> None:
        if self.trainer:
            await self.trainer.stop()
        await self.reward.stop(0)


class ProcessPeers:
    """The same peers in a child process (`--serve-peers`), driven over its stdin/stdout."""

    def __init__(self, cpus: str = "") -> None:
        self.cpus = cpus

    async def start(self) -> ProcessPeers:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--serve-peers", "--peers-cpus", self.cpus,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        return self

    async def new_trainer(self, capacity: int) -> tuple[int, int]:
        self.proc.stdin.write(f"{capacity}\n".encode())
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), 120)
        if not line:
            raise RuntimeError("the peers process died (see its stderr)")
        ports = json.loads(line)
        return ports["trainer"], ports["reward"]

    async def stop(self) -> None:
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            self.proc.kill()


async def serve_peers(cpus: str) -> None:
    """Child side of ProcessPeers: one line "capacity" in -> a fresh trainer, ports out."""
    from agrpo.services.common.logging import setup_logging

    if cpus:  # before the reward workers start: they inherit it
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    setup_logging("bench-peers", "text", "warning")
    peers = await InprocPeers().start()
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            trainer, reward = await peers.new_trainer(int(line))
            print(json.dumps({"trainer": trainer, "reward": reward}), flush=True)
    finally:
        await peers.stop()


# Driver
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--inflight", default="64", help="comma-separated sweep, e.g. 64,256,512")
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=0, help="pad prompts to about N tokens (0: short)")
    p.add_argument("--prompts", type=int, default=0, help="prompts per run (0: waves x inflight / G)")
    p.add_argument("--waves", type=float, default=4.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--scoring-concurrency", type=int, default=4)
    p.add_argument("--generate-endpoint", choices=["auto", "generate", "completions"], default="auto",
                   help="the service's vLLM route (rollout.generate_endpoint); raw always uses generate")
    p.add_argument("--peers", choices=["process", "inproc"], default="process")
    p.add_argument("--peers-cpus", default="", help="CPUs of the peers process, e.g. 0 or 0,1 (default: ours)")
    p.add_argument("--paths", default="raw,service",
                   help="which paths to run, of raw, service, raw_group, service_group (n=G per request)")
    p.add_argument("--vllm-url", default=None, help="a running server (else a CPU vLLM on the tiny model)")
    p.add_argument("--model-dir", default=None, help="its model folder (the tokenizer, unless --tokenizer)")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--serve-peers", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.sweep = [int(x) for x in args.inflight.split(",")]
    unknown = set(args.paths.split(",")) - set(PATHS)
    if unknown:
        p.error(f"--paths: unknown {', '.join(sorted(unknown))} (choose from {', '.join(PATHS)})")
    if args.vllm_url and not args.model_dir:
        p.error("--vllm-url needs --model-dir (the served model's folder: tokenizer and name)")
    return args


async def server_model(url: str) -> tuple[str, int]:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(url + "/v1/models") as r:
        entry = (await r.json())["data"][0]
        return entry["id"], int(entry["max_model_len"])


def build_workload(args, n: int, tokenizer, max_model_len: int, salt: int) -> tuple[Path, list[list[int]]]:
    from agrpo.services.common.config.sections import DatasetConfig
    from agrpo.services.rollout.data import build_prompt_set, load_rows

    prompts = padded_prompts(n, args.prompt_tokens, tokenizer, bool(tokenizer.chat_template), salt)
    data = write_dataset(Path(tempfile.mkdtemp()) / f"d{n}.jsonl", prompts)
    ps = build_prompt_set(load_rows(DatasetConfig(path="json", data_files=str(data))), tokenizer,
                          prompt_column="prompt", max_prompt_len=max_model_len - args.max_tokens,
                          chat_template_kwargs=None, seed=0)
    if len(ps) < n:
        raise SystemExit(f"{n - len(ps)} prompts do not fit max_model_len {max_model_len} - {args.max_tokens}")
    return data, [ps[i].prompt_ids for i in ps.order(0)]


async def sweep(url: str, args) -> list[dict]:
    from agrpo.services.rollout.data import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer or args.model_dir)
    model, max_model_len = await server_model(url)
    peers = await (ProcessPeers(args.peers_cpus) if args.peers == "process" else InprocPeers()).start()
    rows = []
    try:
        for inflight in args.sweep:
            n = args.prompts or max(1, math.ceil(args.waves * inflight / args.G))
            for rep in range(args.repeats):
                raw = None
                for path in args.paths.split(","):
                    salt = len(rows)  # fresh prompts every run: no prefix-cache hits from the last one
                    data, prompt_ids = build_workload(args, n, tokenizer, max_model_len, salt)
                    plen = sum(map(len, prompt_ids)) / len(prompt_ids)
                    grouped = path.endswith("_group")
                    r = (await raw_client(url, model, prompt_ids, args, inflight, args.G if grouped else 1)
                         if path.startswith("raw")
                         else await through_service(url, args, data, n, inflight, peers, grouped))
                    rows.append({"inflight": inflight, "rep": rep, "path": path, "prompts": n,
                                 "prompt_len": plen, **r})
                    print_row(rows[-1], raw)
                    raw = rows[-1] if path == "raw" else raw  # the ratio column is against raw n=1
    finally:
        await peers.stop()
    return rows


def print_row(r: dict, raw: dict | None) -> None:
    tps = r["tokens"] / r["wall"]
    ratio = f"{tps / (raw['tokens'] / raw['wall']):.2f}" if raw else ""
    server = r["server"].summary()
    drops = ",".join(f"{k}={v}" for k, v in (r.get("drops") or {}).items())
    score = f"{r['score_ms']:.0f}" if "score_ms" in r else ""
    print(f"{r['inflight']:>8} {r['rep']:>3}  {r['path']:<8}{r['prompt_len']:>7.0f}{r['tokens']:>9}"
          f"{r['wall']:>8.2f}{r['gen_wall']:>8.2f}{tps:>9.0f}{ratio:>7}  {r['probe'].mean:>6.0f}/{r['probe'].peak:<5}"
          f"{server:>11}{score:>7}  {drops}", flush=True)


def summary(rows: list[dict], args) -> None:
    paths = args.paths.split(",")
    print(f"\nmean over {args.repeats} repeats, tok/s (x raw): inflight, {', '.join(paths)}")
    for inflight in args.sweep:
        tps = {}
        for p in paths:
            v = [r["tokens"] / r["wall"] for r in rows if r["inflight"] == inflight and r["path"] == p]
            tps[p] = sum(v) / len(v) if v else math.nan
        raw = tps.get("raw", math.nan)
        print(f"{inflight:>8} " + " ".join(f"{tps[p]:>8.0f} ({tps[p] / raw:.2f})" for p in paths))


async def main() -> None:
    args = parse_args()
    if args.serve_peers:
        await serve_peers(args.peers_cpus)
        return
    from agrpo.services.common.logging import setup_logging

    setup_logging("bench", "text", "warning")
    server = None
    url = args.vllm_url
    if url is None:
        from agrpo.demo.tiny_model import make_tiny_model
        from vllm_server import VLLMServer

        args.model_dir = str(make_tiny_model(ROOT / ".cache" / "tiny-model" / "seed0", seed=0))
        server = VLLMServer(args.model_dir, max_model_len=1024 if args.prompt_tokens else 512).start()
        url = server.base_url
    print(f"server {url}, model {args.model_dir}; G={args.G}, max_tokens={args.max_tokens}, "
          f"prompt_tokens~{args.prompt_tokens or 'short'}, peers={args.peers}, "
          f"scoring_concurrency={args.scoring_concurrency}")
    print(f"{'inflight':>8} {'rep':>3}  {'path':<8}{'prompt':>7}{'tokens':>9}{'wall s':>8}{'gen s':>8}"
          f"{'tok/s':>9}{'ratio':>7}  {'in flight':<12}{'vLLM r+w':>10}{'scr ms':>7}  drops")
    try:
        rows = await sweep(url, args)
    finally:
        if server:
            server.stop()
    summary(rows, args)


if __name__ == "__main__":
    asyncio.run(main())
