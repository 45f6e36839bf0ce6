"""Batched sampling on a copy of the trainer's model, with exact per-token policy versions.

Requests that arrive together are decoded together: their prompts are left-padded and
prefilled once each (a request's `n` completions share its prompt's KV, as vLLM's parallel
sampling does), then every sequence advances one token per step until it samples a stop
token, reaches max_tokens or max_model_len, or its request is aborted. On a GPU the steps have
fixed shapes and replay as CUDA graphs (static_decode.py); elsewhere the cache grows a token a
step and sequences that finished leave the batch. Each token is labelled with the weight
version it was sampled under: `load` copies a published version's weights in between two
decode steps, so a version can change mid-completion (the KV of earlier tokens is kept, as
vLLM's in-flight update without recompute does) and the completion then carries two spans.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import time
from dataclasses import dataclass, field

import torch

from agrpo.services.common.heap import release_free_heap
from agrpo.services.common.logging import get_logger

from .sampling import SamplingParams, processed_logprobs, sample
from .static_decode import Decoder, KeptShapes

log = get_logger("trainer.generation")
GATHER_S = 0.002
"""How long the first request of a batch waits for others sent with it (a group's, a step's)."""
PRUNE_SHARE = 0.25
"""Finished sequences leave the batch (their KV is dropped) once they are this share of it."""
KEPT_DECODERS = 4
"""Fixed-shape decoders (batch size x cache length, each with its cache and graph) kept for reuse."""


@dataclass
class Request:
    """One generate request: a prompt and its `n` completions."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future | None = None
    aborted: bool = False


def _future(request: Request) -> asyncio.Future:
    assert request.future is not None  # submit() sets it before it queues the request
    return request.future


@dataclass
class Choice:
    """One completion, as vLLM's /inference/v1/generate returns it."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    finish_reason: str | None = None

    def spans(self) -> list[tuple[str, int, int]]:
        """(label, start, end) runs of the tokens' weight versions."""
        out: list[tuple[str, int, int]] = []
        for i, label in enumerate(self.labels):
            if out and out[-1][0] == label:
                out[-1] = (label, out[-1][1], i + 1)
            else:
                out.append((label, i, i + 1))
        return out


class Generator:
    """Decodes batches of requests on its own copy of a causal LM (blocking calls run in a thread)."""

    def __init__(self, model: torch.nn.Module, stop_ids: set[int], max_model_len: int, seed: int = 0,
                 max_sequences: int = 512, static: bool | None = None) -> None:
        self.model = _uncompiled(copy.deepcopy(model)).eval().requires_grad_(False)
        self.device = next(self.model.parameters()).device
        self.stop_ids = set(stop_ids)
        self.max_model_len = max_model_len
        self.max_sequences = max_sequences
        self.label = "default"
        self._lock = threading.Lock()  # one decode step or one weight load at a time
        self._rng = torch.Generator().manual_seed(seed)
        self._queue: asyncio.Queue[Request] = asyncio.Queue()
        self._pending: dict[str, Request] = {}
        self.static = self.device.type == "cuda" if static is None else static
        """Fixed-shape decode steps (static_decode.py): on a GPU, where launches are the cost."""
        self.graphs = self.static and self.device.type == "cuda"
        """Replay them as CUDA graphs (off after a capture fails)."""
        self._decoders: KeptShapes[Decoder] = KeptShapes(KEPT_DECODERS)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        """Decoding's own CUDA stream: on a GPU the trainer shares, its kernels can run beside the
        train step's instead of queueing behind them on the default stream."""

    # Weights
    def load(self, source: torch.nn.Module, label: str) -> None:
        """Copy `source`'s trainable parameters in, between two decode steps; tokens sampled from
        now on carry `label`. Frozen ones (a LoRA trainer's base weights) never change, and the
        copy this generator started from holds them already."""
        with self._lock, torch.no_grad():
            if self._stream is not None:  # the copy waits for queued decode steps, and the next ones for it
                torch.cuda.current_stream(self.device).wait_stream(self._stream)
            for mine, theirs in zip(self.model.parameters(), source.parameters(), strict=True):
                if theirs.requires_grad:
                    mine.copy_(theirs)
            if self._stream is not None:
                self._stream.wait_stream(torch.cuda.current_stream(self.device))
            self.label = label

    # Requests
    async def submit(self, request: Request) -> list[Choice]:
        """Queue a request; its completions once its batch is done (CancelledError if aborted)."""
        request.future = asyncio.get_running_loop().create_future()
        self._pending[request.request_id] = request
        await self._queue.put(request)
        try:
            return await request.future
        finally:
            self._pending.pop(request.request_id, None)

    def abort(self, request_ids: list[str]) -> int:
        """Stop these requests where they are; returns how many were pending."""
        found = 0
        for rid in request_ids:
            request = self._pending.get(rid)
            if request is not None:
                request.aborted = True
                found += 1
        return found

    async def serve(self) -> None:
        """The batching loop: gather what arrives together, decode it in a thread, answer."""
        while True:
            batch = [await self._queue.get()]
            budget = self.max_sequences - batch[0].params.n
            while budget > 0:
                try:
                    nxt = await asyncio.wait_for(self._queue.get(), GATHER_S)
                except TimeoutError:
                    break
                batch.append(nxt)
                budget -= nxt.params.n
            live = [r for r in batch if not r.aborted]
            try:
                results = await asyncio.to_thread(self.generate, live) if live else []
            except Exception as exc:  # noqa: BLE001 - every request of the batch hears of it
                for r in live:
                    if not _future(r).done():
                        _future(r).set_exception(exc)
                continue
            for r, choices in zip(live, results):
                if not _future(r).done():
                    _future(r).set_result(choices)
            for r in batch:
                if r.aborted and not _future(r).done():
                    _future(r).set_result([Choice(finish_reason="abort") for _ in range(r.params.n)])

    # Decoding
    def generate(self, requests: list[Request]) -> list[list[Choice]]:
        """The completions of each request (blocking); on a CPU the batch's freed memory then goes
        back to the OS (services/common/heap.py)."""
        with self._own_stream():
            completions = self._decode(requests)
        if self.device.type == "cpu":
            release_free_heap()
        return completions

    def _own_stream(self) -> contextlib.AbstractContextManager:
        """Decoding's stream made current for this thread, after whatever the caller's stream has
        queued (the weights this generator was copied from)."""
        if self._stream is None:
            return contextlib.nullcontext()
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self._stream)

    @torch.no_grad()
    def _decode(self, requests: list[Request]) -> list[list[Choice]]:
        owner = [i for i, r in enumerate(requests) for _ in range(r.params.n)]
        params = [requests[i].params for i in owner]
        choices = [Choice() for _ in owner]
        budget = [min(p.max_tokens, self.max_model_len - len(requests[i].prompt)) for p, i in zip(params, owner)]
        logits, cache, mask, position, label = self._prefill(requests, owner)
        stepper = self._stepper(cache, mask, position, max(budget))
        rows = list(range(len(owner)))  # the sequence of each batch row
        live = set(rows)  # sequences still generating
        while live:
            self._block_early_stops(logits, [choices[s] for s in rows], [params[s] for s in rows])
            logprobs = processed_logprobs(logits, [params[s] for s in rows])  # of the weights `label` names
            tokens = sample(logprobs, self._rng)
            chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
            for s, token, lp in zip(rows, tokens.tolist(), chosen):
                if s not in live:
                    continue
                choice = choices[s]
                choice.token_ids.append(token)
                choice.logprobs.append(lp)
                choice.labels.append(label)
                choice.finish_reason = self._finish(choice, token, params[s], budget[s], requests[owner[s]].aborted)
                if choice.finish_reason:
                    live.discard(s)
            if not live:
                break
            rows, tokens = stepper.prune(rows, live, tokens)
            with self._lock:
                logits = stepper.advance(tokens)
                label = self.label
        return [[choices[s] for s in range(len(owner)) if owner[s] == i] for i in range(len(requests))]

    def _stepper(self, cache, mask: torch.Tensor, position: torch.Tensor, most_tokens: int):
        """Fixed-shape steps (a CUDA graph each) on a GPU, a growing cache elsewhere, and where
        fixed-shape steps fail (a model whose forward they do not fit: one warning)."""
        if self.static:
            try:
                return _Fixed(self._decoder(cache, mask, position, most_tokens))
            except Exception as exc:  # noqa: BLE001 - the growing cache always works
                log.warning("decoding with a growing cache (fixed-shape steps failed: %s: %s)", type(exc).__name__,
                            str(exc).splitlines()[0][:200] if str(exc) else "")
                self.static = self.graphs = False
        return _Growing(self.model, cache, mask, position)

    def _decoder(self, cache, mask: torch.Tensor, position: torch.Tensor, most_tokens: int) -> Decoder:
        """A kept fixed-shape decoder that holds this batch, else one of the batch's own shape
        (built, and captured, on first use); started."""
        rows, heads, _, head_dim = cache.layers[0].keys.shape
        needed = mask.shape[1] + most_tokens  # positions, not the cache, are bounded by max_model_len
        decoder = self._decoders.take(rows, needed, lambda shape: self._build(shape, (heads, head_dim),
                                                                              cache.layers[0].keys.dtype))
        decoder.start(cache, mask, position)
        return decoder

    def _build(self, shape: tuple[int, int], kv_shape: tuple[int, int], dtype: torch.dtype) -> Decoder:
        """A decoder of this (rows, length), captured as a CUDA graph where graphs are on."""
        started = time.perf_counter()
        decoder = Decoder(self.model, *shape, kv_shape, dtype, self.device)
        with self._lock:  # no weight load between the eager step and the replay it checks
            if self.graphs:
                self.graphs = decoder.capture()
            else:
                decoder.warm_up()  # a step that cannot run fails here, not mid-batch
        log.info("decode steps for %d rows x %d positions ready in %.2f s (%s)", *shape,
                 time.perf_counter() - started, "a CUDA graph" if decoder.graph is not None else "eager")
        return decoder

    def _prefill(self, requests: list[Request], owner: list[int]):
        """Each prompt once, left-padded; then its KV, mask and next position repeated for its n."""
        from transformers import DynamicCache

        width = max(len(r.prompt) for r in requests)
        ids = torch.zeros(len(requests), width, dtype=torch.long)
        mask = torch.zeros(len(requests), width, dtype=torch.long)
        for i, r in enumerate(requests):
            ids[i, width - len(r.prompt):] = torch.tensor(r.prompt)
            mask[i, width - len(r.prompt):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        with self._lock:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                             past_key_values=DynamicCache(), use_cache=True)
            label = self.label
        index = torch.tensor(owner, device=self.device)
        cache = out.past_key_values
        cache.batch_select_indices(index)
        return out.logits[:, -1, :][index], cache, mask[index], positions[:, -1][index], label

    def _block_early_stops(self, logits: torch.Tensor, choices: list[Choice], params: list[SamplingParams]) -> None:
        """Before min_tokens a stop token cannot be sampled (vLLM's rule)."""
        for row, (choice, p) in enumerate(zip(choices, params)):
            if len(choice.token_ids) < p.min_tokens:
                stops = [t for t in self._stops(p) if t < logits.shape[1]]
                logits[row, stops] = float("-inf")

    def _stops(self, p: SamplingParams) -> set[int]:
        return (set() if p.ignore_eos else self.stop_ids) | set(p.stop_token_ids)

    def _finish(self, choice: Choice, token: int, p: SamplingParams, budget: int, aborted: bool) -> str | None:
        if aborted:
            return "abort"
        if token in self._stops(p) and len(choice.token_ids) >= p.min_tokens:
            return "stop"
        if len(choice.token_ids) >= budget:
            return "length"
        return None


class _Growing:
    """Steps over a cache that grows by a token a step; finished rows leave the batch."""

    def __init__(self, model: torch.nn.Module, cache, mask: torch.Tensor, position: torch.Tensor) -> None:
        self.model, self.cache, self.mask, self.position = model, cache, mask, position

    def prune(self, rows: list[int], live: set[int], tokens: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        """Drop finished rows (and their KV) once they are PRUNE_SHARE of the batch."""
        if len(live) > (1 - PRUNE_SHARE) * len(rows):
            return rows, tokens
        keep = [r for r, s in enumerate(rows) if s in live]
        index = torch.tensor(keep, device=tokens.device)
        self.cache.batch_select_indices(index)
        self.mask, self.position = self.mask[index], self.position[index]
        return [rows[r] for r in keep], tokens[index]

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(tokens), 1)], dim=1)
        self.position = self.position + 1
        out = self.model(input_ids=tokens.unsqueeze(1), attention_mask=self.mask,
                         position_ids=self.position.unsqueeze(1), past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.logits[:, -1, :]


class _Fixed:
    """Steps of fixed shape (static_decode.py); every row stays to the end of the batch."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder

    def prune(self, rows: list[int], live: set[int], tokens: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        return rows, tokens

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.decoder.step(tokens)


def _uncompiled(model: torch.nn.Module) -> torch.nn.Module:
    """The copy decodes eager: the trainer's in-place `module.compile()` (its layers on a GPU)
    travels with a deep copy, and decode shapes (one new token, a KV cache that grows every
    step) would recompile it over and over inside timed generation."""
    for module in model.modules():
        if getattr(module, "_compiled_call_impl", None) is not None:
            module._compiled_call_impl = None
    return model
