"""One vLLM server over HTTP: start-up handshake, token-in/token-out generation, abort.

Prefers `/inference/v1/generate` (token ids in and out, per-token logprobs and
per-token `weight_versions` spans); falls back to `/v1/completions` with
`return_token_ids`. Both return vLLM's `processed_logprobs` when the server runs
with `--logprobs-mode processed_logprobs`, i.e. the distribution actually sampled.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from agrpo.services.common.logging import get_logger
from agrpo.services.common.timeouts import (
    ABORT_TIMEOUT_S,
    GENERATE_PROBE_TIMEOUT_S,
    VLLM_GET_TIMEOUT_S,
    VLLM_HEALTH_TIMEOUT_S,
    WEIGHT_LABEL_TIMEOUT_S,
)
from agrpo.services.common.versions import adapter_version
from agrpo.services.common.vllm_api import TRAINER_ENGINE
from agrpo.services.common.vllm_api import parse_vllm_version as parse_version

log = get_logger("rollout.vllm")


class VLLMError(RuntimeError):
    """A request to vLLM failed (HTTP error, bad payload, connection loss, timeout). `status` is
    the HTTP status when the server answered one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def request_refused(self) -> bool:
        """The server answered and refused this request (4xx, not timeout or rate limit): it says
        nothing about the server's health, so the server stays up for the others."""
        return self.status is not None and 400 <= self.status < 500 and self.status not in (408, 429)


class VLLMIncompatible(RuntimeError):
    """The server cannot be used (too old, not in dev mode): fatal at start."""


@dataclass(frozen=True)
class SamplingConfig:
    """The seed's sampling parameters for one completion."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    n: int = 1
    """Completions per request: 1 as in TRL, or a whole group (vLLM's parallel sampling)."""

    def params(self) -> dict[str, Any]:
        """vLLM SamplingParams fields (top_k <= 0 means disabled: sent as -1)."""
        out = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
               "top_k": self.top_k if self.top_k > 0 else -1,
               "repetition_penalty": self.repetition_penalty, "n": self.n}
        if self.min_p is not None:
            out["min_p"] = self.min_p
        return out


@dataclass
class Completion:
    """One generated completion, token for token."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    # (weight label, start, end) over token_ids; empty when the server gives none.
    spans: list[tuple[str, int, int]] = field(default_factory=list)
    latency_s: float = 0.0
    server: str = ""


@dataclass
class ServerInfo:
    """What the handshake learned about a server."""

    version: str
    model: str
    max_model_len: int
    has_generate: bool


class VLLMClient:
    """Talks to one vLLM base URL through a shared aiohttp session."""

    def __init__(self, base_url: str, session: aiohttp.ClientSession, *, request_timeout: float,
                 model: str | None = None, endpoint: str = "auto") -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=request_timeout)
        self.model = model
        self.endpoint = endpoint
        self.info: ServerInfo | None = None

    async def _get(self, path: str, timeout: float = VLLM_GET_TIMEOUT_S) -> Any:
        async with self.session.get(self.base_url + path,
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            r.raise_for_status()
            return await r.json(content_type=None)

    async def healthy(self, timeout: float = VLLM_HEALTH_TIMEOUT_S) -> bool:
        """True when GET /health answers 200."""
        try:
            async with self.session.get(self.base_url + "/health",
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                return r.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def wait_healthy(self, timeout_s: float, poll_s: float = 0.1, say_every_s: float = 5.0) -> None:
        """Poll /health until 200, saying so every few seconds; TimeoutError after timeout_s. Polled
        often: the first step waits for it (a local refused connection costs microseconds)."""
        t0 = time.monotonic()
        said = t0
        while not await self.healthy():
            now = time.monotonic()
            if now - t0 > timeout_s:
                raise TimeoutError(f"vLLM at {self.base_url} not healthy after {timeout_s:.0f} s "
                                   "(vllm_server_timeout)")
            if now - said >= say_every_s:
                log.info("waiting for vLLM at %s (%.0f/%.0f s)", self.base_url, now - t0, timeout_s)
                said = now
            await asyncio.sleep(poll_s)

    async def handshake(self, timeout_s: float, min_version: str) -> ServerInfo:
        """Wait for health, check version and dev mode, read the model and max_model_len."""
        await self.wait_healthy(timeout_s)
        answer = await self._get("/version")
        version = answer.get("version", "0")
        if answer.get("engine") != TRAINER_ENGINE and parse_version(version) < parse_version(min_version):
            raise VLLMIncompatible(f"vLLM at {self.base_url} is {version}; agrpo needs >= {min_version} "
                                   "(RL weight-update API). Upgrade vLLM.")
        try:
            await self._get("/is_paused")
        except aiohttp.ClientResponseError as exc:
            raise VLLMIncompatible(
                f"vLLM at {self.base_url} is not in dev mode (GET /is_paused -> {exc.status}); start it "
                "with VLLM_SERVER_DEV_MODE=1 so the trainer can pause it and push weights") from None
        models = (await self._get("/v1/models"))["data"]
        model = self.model or models[0]["id"]
        entry = next((m for m in models if m["id"] == model), models[0])
        self.model = entry["id"]
        has_generate = self.endpoint != "completions" and await self._probe_generate()
        if self.endpoint == "generate" and not has_generate:
            raise VLLMIncompatible(f"vLLM at {self.base_url} does not serve /inference/v1/generate; "
                                   "start it with --enable-scale-out or set rollout.generate_endpoint")
        self.info = ServerInfo(version, self.model, int(entry["max_model_len"]), has_generate)
        log.info("vLLM %s at %s: model %s, max_model_len %d, endpoint %s", version, self.base_url,
                 self.model, self.info.max_model_len,
                 "/inference/v1/generate" if has_generate else "/v1/completions")
        return self.info

    async def _probe_generate(self) -> bool:
        body = {"token_ids": [0], "sampling_params": {"max_tokens": 1, "temperature": 0.0}}
        try:
            async with self.session.post(self.base_url + "/inference/v1/generate", json=body,
                                         timeout=aiohttp.ClientTimeout(total=GENERATE_PROBE_TIMEOUT_S)) as r:
                return r.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def weight_label(self) -> str | None:
        """The server's current weight version label (GET /weight_info), if offered."""
        try:
            return (await self._get("/weight_info", timeout=WEIGHT_LABEL_TIMEOUT_S)).get("weight_version")
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None

    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig,
                       request_id: str, cache_salt: str | None = None, adapter: str = "") -> Completion:
        """One completion (`sampling.n` is 1); raises VLLMError on any failure."""
        return (await self.generate_all(prompt_ids, sampling, request_id, cache_salt, adapter))[0]

    async def generate_all(self, prompt_ids: list[int], sampling: SamplingConfig,
                           request_id: str, cache_salt: str | None = None, adapter: str = "") -> list[Completion]:
        """The `sampling.n` completions of one request; raises VLLMError on any failure, and
        VLLMIncompatible when the server answers fewer. Requests share cached prompt KV only under
        the same `cache_salt`. `adapter` names the LoRA adapter of one policy version (adapter-only
        sync): every token is that version's, whatever the server's weight label says."""
        salt = {"cache_salt": cache_salt} if cache_salt else {}
        model = adapter or self.model
        t0 = time.monotonic()
        try:
            if self.info is not None and self.info.has_generate:
                outs = await self._generate_tokens(prompt_ids, sampling, request_id, model, salt)
            else:
                outs = await self._completions(prompt_ids, sampling, request_id, model, salt)
        except (TimeoutError, aiohttp.ClientError, OSError, KeyError, TypeError, ValueError) as exc:
            status = exc.status if isinstance(exc, aiohttp.ClientResponseError) else None
            raise VLLMError(f"{self.base_url}: {type(exc).__name__}: {exc}", status) from exc
        if len(outs) != sampling.n:
            self._refuse_partial(len(outs), sampling.n)
        latency = time.monotonic() - t0
        for out in outs:
            out.latency_s, out.server = latency, self.base_url
            if adapter:
                out.spans = [(str(adapter_version(adapter)), 0, len(out.token_ids))]
            if len(out.logprobs) != len(out.token_ids):
                raise VLLMError(f"{self.base_url}: {len(out.token_ids)} tokens but {len(out.logprobs)} logprobs")
        return outs

    def _refuse_partial(self, got: int, asked: int) -> None:
        """An answer without every completion asked for: vLLM 0.26's /inference/v1/generate keeps
        only the completions of an n > 1 request that ended in its last step, so that server can
        never serve one request per group."""
        if asked == 1:
            raise VLLMError(f"{self.base_url}: an answer without a completion")
        raise VLLMIncompatible(f"vLLM at {self.base_url} answered {got} of the {asked} completions asked for "
                               "in one request: it cannot serve rollout.one_request_per_group (set it false)")

    async def _post(self, path: str, body: dict) -> dict:
        async with self.session.post(self.base_url + path, json=body, timeout=self.timeout) as r:
            if r.status != 200:
                text = (await r.text())[:500]
                raise aiohttp.ClientResponseError(r.request_info, (), status=r.status, message=text)
            return await r.json(content_type=None)

    async def _generate_tokens(self, prompt_ids, sampling, request_id, model, extra: dict) -> list[Completion]:
        # Token ids in and out: vLLM's API server need not decode every token of every request
        # into text nobody reads (rollout decodes the finished completion once). That work sits on
        # the API server's core (docs/measurements/async-measurements.md, "detokenize").
        params = {**sampling.params(), "logprobs": 0, "detokenize": False}
        data = await self._post("/inference/v1/generate", {
            "request_id": request_id, "token_ids": prompt_ids, "sampling_params": params,
            "model": model, **extra})
        return [_completion(c, [float(x["logprob"]) for x in (c.get("logprobs") or {}).get("content") or []])
                for c in _in_order(data["choices"])]

    async def _completions(self, prompt_ids, sampling, request_id, model, extra: dict) -> list[Completion]:
        data = await self._post("/v1/completions", {
            "model": model, "prompt": prompt_ids, "logprobs": 0,
            "return_token_ids": True, "request_id": request_id, **sampling.params(), **extra})
        return [_completion(c, [float(x) for x in (c.get("logprobs") or {}).get("token_logprobs") or []])
                for c in _in_order(data["choices"])]

    async def abort(self, request_ids: list[str]) -> None:
        """Best-effort abort of in-flight requests (the cancelled HTTP call aborts too)."""
        if not request_ids:
            return
        ids = [*request_ids, *(f"generate-tokens-{r}" for r in request_ids)]
        path = "/inference/v1/abort_requests" if self.info and self.info.has_generate else "/abort_requests"
        try:
            async with self.session.post(self.base_url + path, json={"request_ids": ids},
                                         timeout=aiohttp.ClientTimeout(total=ABORT_TIMEOUT_S)) as r:
                await r.read()
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass


def _in_order(choices: list[dict]) -> list[dict]:
    """A response's choices by their index (one per completion of the request)."""
    return sorted(choices, key=lambda c: c.get("index", 0))


def _completion(choice: dict, logprobs: list[float]) -> Completion:
    """One choice of a response, with its weight-version spans (empty when the server gives none)."""
    spans = [(str(s["version"]), int(s["start"]), int(s["end"])) for s in choice.get("weight_versions") or []]
    return Completion(list(choice["token_ids"]), logprobs, choice.get("finish_reason"), spans)
