"""Spread generation requests over several vLLM servers and survive their failures.

Each request goes to the healthy server with the least outstanding work. A
failed request marks its server down (exponential back-off, health probes until
it answers again) and is retried on another server; only after
`request_retries` attempts does the caller see `GenerationFailed`, and then it
re-issues the group. A request the server answered and refused (a 4xx such as 400:
NaN logprobs, a bad prompt) is retried too, but leaves the server up for the
others. One bad request never stops the service; a prompt refused every time
stops the run with vLLM's reason (rollout/engine.py, PERMANENT_REFUSALS).
"""

from __future__ import annotations

import asyncio
from collections import deque

from agrpo.services.common.logging import get_logger

from .vllm_client import Completion, SamplingConfig, VLLMClient, VLLMError

log = get_logger("rollout.balancer")


class GenerationFailed(RuntimeError):
    """Every attempt of one request failed; `refused`: every one was a refusal of the request
    itself (a 4xx such as 400 for a prompt past max_model_len), not a server failure."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class ServerState:
    """Load and health of one server as the balancer sees it."""

    def __init__(self, client: VLLMClient) -> None:
        self.client = client
        self.outstanding = 0
        self.up = True
        self.failures = 0
        self.completed = 0
        self.weight_label = ""
        self.latencies: deque[float] = deque(maxlen=64)
        self.probe: asyncio.Task | None = None

    @property
    def mean_latency_s(self) -> float:
        return sum(self.latencies) / len(self.latencies) if self.latencies else 0.0


class Balancer:
    """Least-outstanding-work routing with mark-down, back-off and retries."""

    def __init__(self, clients: list[VLLMClient], *, retries: int = 3, backoff_s: float = 1.0,
                 backoff_max_s: float = 30.0, on_latency=None) -> None:
        self.servers = [ServerState(c) for c in clients]
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.on_latency = on_latency  # callback(server_url, seconds) for metrics
        self._changed = asyncio.Condition()

    async def _pick(self) -> ServerState:
        """The up server with the least outstanding requests; waits while all are down."""
        async with self._changed:
            while True:
                up = [s for s in self.servers if s.up]
                if up:
                    return min(up, key=lambda s: s.outstanding)
                await self._changed.wait()

    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig,
                       request_id: str, cache_salt: str | None = None, adapter: str = "") -> Completion:
        """One completion from some server (`sampling.n` is 1)."""
        return (await self.generate_all(prompt_ids, sampling, request_id, cache_salt, adapter))[0]

    async def generate_all(self, prompt_ids: list[int], sampling: SamplingConfig,
                           request_id: str, cache_salt: str | None = None, adapter: str = "") -> list[Completion]:
        """The `sampling.n` completions of one request, from some server; GenerationFailed after
        `retries` attempts. `adapter`: the LoRA adapter to generate with (VLLMClient.generate_all)."""
        last: Exception | None = None
        refused = True
        for attempt in range(self.retries):
            server = await self._pick()
            server.outstanding += sampling.n
            try:
                outs = await server.client.generate_all(prompt_ids, sampling, f"{request_id}-a{attempt}", cache_salt,
                                                        adapter)
            except VLLMError as exc:
                last, refused = exc, refused and exc.request_refused
                if not exc.request_refused:  # one refused request (e.g. 400) leaves the server up
                    await self._mark_failed(server, exc)
                continue
            finally:
                server.outstanding -= sampling.n
            server.completed += 1
            server.latencies.append(outs[0].latency_s)
            if self.on_latency:
                self.on_latency(server.client.base_url, outs[0].latency_s)
            return outs
        raise GenerationFailed(f"request {request_id} failed {self.retries} times: {last}",
                               refused=refused and last is not None)

    async def _mark_failed(self, server: ServerState, exc: Exception) -> None:
        server.failures += 1
        if not server.up:
            return
        server.up = False
        log.warning("vLLM server %s marked down: %s", server.client.base_url, exc)
        server.probe = asyncio.create_task(self._probe_until_up(server))

    async def _probe_until_up(self, server: ServerState) -> None:
        """Back off exponentially, probing /health, until the server answers again."""
        delay = self.backoff_s
        while True:
            await asyncio.sleep(delay)
            if await server.client.healthy():
                break
            delay = min(delay * 2, self.backoff_max_s)
        async with self._changed:
            server.up = True
            self._changed.notify_all()
        log.info("vLLM server %s is back", server.client.base_url)

    async def abort(self, request_ids: list[str]) -> None:
        """Best-effort abort of request ids (all attempts) on every up server."""
        ids = [f"{r}-a{a}" for r in request_ids for a in range(self.retries)]
        await asyncio.gather(*(s.client.abort(ids) for s in self.servers if s.up))

    async def close(self) -> None:
        for s in self.servers:
            if s.probe:
                s.probe.cancel()

    def snapshot(self) -> list[dict]:
        """Per-server state for status and metrics."""
        return [{"base_url": s.client.base_url, "up": s.up, "outstanding": s.outstanding,
                 "mean_latency_s": s.mean_latency_s, "failures": s.failures,
                 "weight_label": s.weight_label} for s in self.servers]

