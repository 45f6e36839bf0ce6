"""Adapters staged by our worker extension into a real vLLM (CPU) act exactly once, every time.

The trap (issue 37): vLLM folds lora_alpha / r into lora_B in place when it loads an adapter, so a
server that reloads an evicted adapter from tensors it holds in memory applies the scale twice.
Here the server keeps a single adapter in its CPU cache (--max-cpu-loras 1), so naming another
adapter evicts the first and naming the first again reloads it. Its logprobs must equal the HF
model's with the adapter applied once (and be far from the base and from a double-scaled adapter)
on first use and after the reload. Also pinned: unregistering a name leaves a running request that
named it generating to the end (the trainer unregisters the oldest adapter while rollout may still
be finishing a request with it).
"""

from __future__ import annotations

import base64
import json
import urllib.request
from functools import cache

import pytest

pytestmark = pytest.mark.vllm

PROMPT = [5, 17, 42, 9, 33, 8, 21]
TOKENS = 8
SCALE = 4.0  # lora_alpha / r: large, so acting twice is far from acting once


@pytest.fixture(scope="module")
def lora_server(tiny_model_dir):
    from agrpo.launcher.vllm_process import lora_args
    from vllm_server import VLLMServer

    server = VLLMServer(tiny_model_dir, extra_args=(*lora_args(8, 1), "--max-cpu-loras", "1")).start()
    try:
        yield server
    finally:
        server.stop()


@cache
def _adapted(model_dir: str, seed: int, scale_factor: float = 1.0):
    """The tiny model with a random r=8 adapter (B scaled by `scale_factor`, 0 for the base)."""
    import torch
    from transformers import AutoModelForCausalLM

    from agrpo.services.common.config.sections import PeftSection
    from agrpo.services.trainer import lora

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()
    model = lora.attach(model, PeftSection(r=8, lora_alpha=8 * SCALE, target_modules="all-linear"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05 * scale_factor)
    return model


def _stage(server, model, version: int) -> None:
    """What an adapter-only sync does: the tensors inline, staged by the worker extension, then registered."""
    from safetensors.torch import save

    from agrpo.services.trainer import lora

    raw = save(dict(lora.adapter_tensors(model)), metadata={"format": "pt"})
    infos = [{"safetensors_b64": base64.b64encode(raw).decode("ascii")}]
    name = f"agrpo-v{version}"
    body = {"method": "agrpo_stage_adapter", "timeout": 60,
            "args": [name, lora.adapter_config_json(model, None), json.dumps(infos), "10"]}
    path = server.post_json("/collective_rpc", body)["results"][0]["path"]
    _post_text(server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})


def _post_text(server, path: str, body: dict) -> str:
    """vLLM's adapter endpoints answer plain text."""
    req = urllib.request.Request(server.base_url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()


def _vllm(server, name: str, max_tokens: int = TOKENS) -> tuple[list[int], list[float]]:
    r = server.post_json("/v1/completions", {"model": name, "prompt": PROMPT, "max_tokens": max_tokens,
                                             "temperature": 0.0, "logprobs": 0, "ignore_eos": True,
                                             "return_token_ids": True})
    choice = r["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _hf_logprobs(model, tokens: list[int]) -> list[float]:
    import torch

    ids = torch.tensor([PROMPT + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    return [float(logp[len(PROMPT) - 1 + i, t]) for i, t in enumerate(tokens)]


def _in_flight(server) -> int:
    """Requests vLLM holds, running or waiting (its Prometheus gauges)."""
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines() if line.startswith(gauges))


def _stream(server, name: str, max_tokens: int):
    """A streaming completion (the response, read chunk by chunk with _chunks)."""
    body = {"model": name, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(server.base_url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


def _chunks(response):
    for raw in response:
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: "):])


def _gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_an_evicted_adapter_reloads_scaled_once(lora_server, tiny_model_dir):
    once, other = _adapted(str(tiny_model_dir), 1), _adapted(str(tiny_model_dir), 2)
    twice, base = _adapted(str(tiny_model_dir), 1, 2.0), _adapted(str(tiny_model_dir), 1, 0.0)
    _stage(lora_server, once, 1)
    _stage(lora_server, other, 2)

    tokens, first = _vllm(lora_server, "agrpo-v1")
    assert _gap(first, _hf_logprobs(once, tokens)) < 2e-3
    assert _gap(first, _hf_logprobs(base, tokens)) > 0.05  # the adapter acts...
    assert _gap(first, _hf_logprobs(twice, tokens)) > 0.05  # ...and the test would see it act twice

    _vllm(lora_server, "agrpo-v2")  # evicts agrpo-v1 from the server's one-adapter cache
    again_tokens, again = _vllm(lora_server, "agrpo-v1")  # reloaded
    assert again_tokens == tokens
    assert _gap(again, first) < 1e-4


def test_unregistering_an_adapter_leaves_its_running_request_to_finish(lora_server, tiny_model_dir):
    """The request is held mid-generation (pause, mode keep) while its adapter is unregistered."""
    _stage(lora_server, _adapted(str(tiny_model_dir), 3), 3)
    for _ in range(3):  # a tiny model may finish 400 tokens before the pause lands: then again
        with _stream(lora_server, "agrpo-v3", 400) as response:
            chunks = _chunks(response)
            next(chunks)  # its first token came back: the request runs
            _post_text(lora_server, "/pause?mode=keep", {})
            try:
                held = _in_flight(lora_server)
                if held:
                    _post_text(lora_server, "/v1/unload_lora_adapter", {"lora_name": "agrpo-v3"})
            finally:
                _post_text(lora_server, "/resume", {})
            usage = [c["usage"] for c in chunks if c.get("usage")]
        if held:
            break
    assert held, "every request finished before the pause: nothing was in flight to test"
    assert usage[-1]["completion_tokens"] == 400
    names = [m["id"] for m in lora_server.get_json("/v1/models")["data"]]
    assert "agrpo-v3" not in names
