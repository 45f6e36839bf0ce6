"""Smoke tests against a real vLLM server serving the tiny model on CPU.

They pin down what agrpo relies on: token-in/token-out completions with
per-token logprobs, greedy parity with HF transformers (so the trainer's
logprobs and the sampler's agree), per-token ``weight_versions``, and the
official pause -> update -> resume weight-sync flow through our ``cpu_http``
plugin.
"""

from __future__ import annotations

import base64
import json
import math
from functools import cache

import pytest

pytestmark = pytest.mark.vllm

MAX_TOKENS = 16


@cache
def _hf(model_dir: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()
    return AutoTokenizer.from_pretrained(model_dir), model


def hf_greedy(model_dir, prompt_ids: list[int], n: int = MAX_TOKENS) -> list[int]:
    import torch

    _, model = _hf(str(model_dir))
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


def vllm_greedy(server, prompt_ids: list[int], n: int = MAX_TOKENS) -> list[int]:
    r = server.post_json("/v1/completions", {"model": server.model_name, "prompt": prompt_ids,
                                              "max_tokens": n, "temperature": 0.0, "return_token_ids": True})
    return r["choices"][0]["token_ids"]


@pytest.fixture(scope="module")
def prompts(tiny_model_dir) -> list[list[int]]:
    tok, _ = _hf(str(tiny_model_dir))
    chat = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}],
                                   add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    return [tok.encode("What is 12 + 7? The answer is"), list(chat)]


def test_sampled_completions_have_token_ids_and_logprobs(vllm_server, prompts):
    r = vllm_server.post_json("/v1/completions", {
        "model": vllm_server.model_name, "prompt": prompts[0], "n": 4, "max_tokens": MAX_TOKENS,
        "temperature": 1.0, "return_token_ids": True, "logprobs": 0,
        "ignore_eos": True})  # so every sample has exactly MAX_TOKENS tokens
    assert len(r["choices"]) == 4
    for c in r["choices"]:
        assert len(c["token_ids"]) == MAX_TOKENS
        lps = c["logprobs"]["token_logprobs"]
        assert len(lps) == MAX_TOKENS
        assert all(math.isfinite(x) and x <= 0.0 for x in lps)


def test_greedy_matches_hf(vllm_server, tiny_model_dir, prompts):
    for p in prompts:
        assert vllm_greedy(vllm_server, p) == hf_greedy(tiny_model_dir, p)


def test_generate_endpoint_reports_weight_versions(vllm_server, prompts):
    r = vllm_server.post_json("/inference/v1/generate", {
        "token_ids": prompts[0], "sampling_params": {"max_tokens": 8, "temperature": 0.0, "logprobs": 0}})
    choice = r["choices"][0]
    current = vllm_server.get_json("/weight_info")["weight_version"]
    spans = choice["weight_versions"]
    assert spans and spans[0]["version"] == current and spans[0]["start"] == 0
    assert spans[-1]["end"] == len(choice["token_ids"])


async def test_a_group_in_one_request_and_its_abort(vllm_server, tiny_model_dir, prompts):
    """rollout.one_request_per_group: the G completions of one request (n = G) each come with
    their own tokens, logprobs and weight spans, and aborting the request's id stops them all."""
    import aiohttp

    from agrpo.services.rollout.vllm_client import SamplingConfig, VLLMClient

    vocab = json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]
    # Half the vocabulary stops a completion: the 8 end at different steps (vLLM 0.26 then
    # answered only some of them; the client refuses such an answer)
    uneven = {"token_ids": prompts[0], "model": vllm_server.model_name,
              "sampling_params": {"max_tokens": 32, "n": 8, "logprobs": 0, "temperature": 1.0,
                                  "stop_token_ids": list(range(vocab // 2, vocab))}}
    long = {"token_ids": prompts[0], "request_id": "grp-long", "model": vllm_server.model_name,
            "sampling_params": {"max_tokens": 480, "n": 4, "ignore_eos": True, "logprobs": 0}}
    async with aiohttp.ClientSession() as session:
        client = VLLMClient(vllm_server.base_url, session, request_timeout=120)
        await client.handshake(60, "0.22.0")
        group = await client.generate_all(prompts[0], SamplingConfig(max_tokens=8, n=4), "grp")
        for _ in range(5):  # all 8 stopped at the same step (7% of requests here; a CI run saw it): again
            async with session.post(vllm_server.base_url + "/inference/v1/generate", json=uneven) as r:
                uneven_choices = (await r.json())["choices"]
            if len({len(c["token_ids"]) for c in uneven_choices}) > 1:
                break
        for attempt in range(3):  # an abort that came after the request ended: again
            body = dict(long, request_id=f"grp-long-{attempt}")
            cut = await _aborted_while_running(client, vllm_server.base_url, body)
            if any(c["finish_reason"] == "abort" for c in cut):
                break
    assert len(group) == 4 and len({tuple(c.token_ids) for c in group}) > 1  # each sampled on its own
    for c in group:
        assert len(c.token_ids) == len(c.logprobs) and c.spans and c.spans[-1][2] == len(c.token_ids)
    # every child stopped with the parent
    assert len(cut) == 4 and all(c["finish_reason"] == "abort" and len(c["token_ids"]) < 480 for c in cut)
    assert len(uneven_choices) == 8 and len({len(c["token_ids"]) for c in uneven_choices}) > 1


async def _aborted_while_running(client, base_url: str, body: dict) -> list[dict]:
    """The choices of `body`'s request, aborted by its id while it runs. The request goes on a
    session of its own: on the client's session an abort could wait behind it for a connection
    and arrive after it had ended. An abort before vLLM has the request (or before it has added
    all of its children) misses what is not there yet, so aborts go every 20 ms, none waiting
    for the answer of the last, until the request answers. (Fresh-clone CI runs still saw the
    request answer with all 480 tokens: the caller tries again when no child was aborted.)"""
    import asyncio

    import aiohttp

    async def post() -> list[dict]:
        async with aiohttp.ClientSession() as own, own.post(base_url + "/inference/v1/generate", json=body) as r:
            return (await r.json())["choices"] if r.status == 200 else []

    pending = asyncio.create_task(post())
    aborts = []
    for _ in range(500):
        done, _ = await asyncio.wait({pending}, timeout=0.02)
        if done:
            break
        aborts.append(asyncio.create_task(client.abort([body["request_id"]])))
    await asyncio.gather(*aborts, return_exceptions=True)
    return await pending


def _safetensors_chunks_b64(model_dir, n_chunks: int = 2) -> list[str]:
    """The checkpoint split into chunks, as a trainer would stream it."""
    from safetensors.torch import load_file, save

    sd = load_file(str(model_dir / "model.safetensors"))
    names = sorted(sd)
    parts = [names[i::n_chunks] for i in range(n_chunks)]
    return [base64.b64encode(save({k: sd[k] for k in part})).decode() for part in parts]


def _push_weights(server, update_infos: list[dict], version: str) -> None:
    server.post_json("/pause?mode=keep")
    try:
        server.post_json("/start_weight_update")
        for info in update_infos:
            server.post_json("/update_weights", {"update_info": info})
        server.post_json("/finish_weight_update", {"weight_version": version})
        server.post_json("/reset_prefix_cache")
    finally:
        server.post_json("/resume")


def test_weight_update_through_cpu_http_plugin(vllm_server, tiny_model_dir, tiny_model_factory, prompts):
    v2_dir = tiny_model_factory(1)
    expected_v1 = [hf_greedy(tiny_model_dir, p) for p in prompts]
    expected_v2 = [hf_greedy(v2_dir, p) for p in prompts]
    assert expected_v1 != expected_v2, "seed 0 and seed 1 models should differ"

    vllm_server.post_json("/init_weight_transfer_engine", {"init_info": {}})
    _push_weights(vllm_server, [{"safetensors_b64": b} for b in _safetensors_chunks_b64(v2_dir)], "v2")
    try:
        assert vllm_server.get_json("/weight_info") == {"weight_version": "v2"}
        assert [vllm_greedy(vllm_server, p) for p in prompts] == expected_v2
    finally:
        # Restore the session server (via the `path` variant) for later tests.
        _push_weights(vllm_server, [{"path": str(tiny_model_dir)}], "default")
    assert [vllm_greedy(vllm_server, p) for p in prompts] == expected_v1


def _greedy_logprobs(server, prompts: list[list[int]]) -> list[dict]:
    """Greedy tokens with their top-5 logprobs: equal only for bit-equal weights, give or take."""
    out = []
    for p in prompts:
        r = server.post_json("/v1/completions", {"model": server.model_name, "prompt": p, "max_tokens": 8,
                                                 "temperature": 0.0, "logprobs": 5, "return_token_ids": True})
        choice = r["choices"][0]
        out.append({"ids": choice["token_ids"], "top": choice["logprobs"]["top_logprobs"]})
    return out


def test_kept_reload_packs_what_vllms_layerwise_reload_packs(vllm_server, tiny_model_dir, tiny_model_factory,
                                                             prompts):
    """Our cpu_http engine's kept reload (the default) against vLLM's layerwise one: after the
    same updates, a whole one and one that leaves most layers out, the same logprobs to the bit.
    The kept reload first runs after a layerwise one, which leaves its wrappers on vLLM's
    recorded loaders (they once swallowed the kept reload's writes: NaN logits)."""
    from safetensors.torch import load_file, save

    v2_dir = tiny_model_factory(1)
    v2 = load_file(str(v2_dir / "model.safetensors"))
    partial = base64.b64encode(save({k: t for k, t in v2.items()
                                     if k.startswith(("lm_head.", "model.layers.1."))})).decode()
    whole, original = [{"path": str(v2_dir)}], [{"path": str(tiny_model_dir)}]
    seen = {}
    try:
        for mode in ("layerwise", "auto"):
            vllm_server.post_json("/init_weight_transfer_engine", {"init_info": {"reload": mode}})
            _push_weights(vllm_server, original, f"{mode}-v1")
            _push_weights(vllm_server, [{"safetensors_b64": partial}], f"{mode}-v1+")
            seen[mode, "partial"] = _greedy_logprobs(vllm_server, prompts)
            _push_weights(vllm_server, whole, f"{mode}-v2")
            seen[mode, "whole"] = _greedy_logprobs(vllm_server, prompts)
    finally:
        vllm_server.post_json("/init_weight_transfer_engine", {"init_info": {}})
        _push_weights(vllm_server, original, "default")
    assert [vllm_greedy(vllm_server, p) for p in prompts] == [hf_greedy(tiny_model_dir, p) for p in prompts]
    assert seen["auto", "whole"] == seen["layerwise", "whole"]
    assert seen["auto", "partial"] == seen["layerwise", "partial"]
    assert seen["auto", "partial"] != seen["auto", "whole"]  # the partial update left layers as they were
    assert "cpu_http: kept reload" in vllm_server.log_path.read_text(errors="replace")
