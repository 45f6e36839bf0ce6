"""The trainer's own generator (weight_transport local): the distribution it samples from, its
logprobs against the model's own, stops and lengths, version labels, and the HTTP routes rollout's
vLLM client talks to."""

from __future__ import annotations

import asyncio
import math

import aiohttp
import pytest
import torch

from agrpo.services.rollout.vllm_client import SamplingConfig, VLLMClient
from agrpo.services.trainer.generation import server
from agrpo.services.trainer.generation.generator import Choice, Generator, Request
from agrpo.services.trainer.generation.sampling import SamplingParams, processed_logprobs


def test_processed_logprobs_are_the_sampled_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]] * 4)
    rows = [SamplingParams(temperature=0.5), SamplingParams(top_k=2), SamplingParams(top_p=0.7),
            SamplingParams(temperature=0.0)]
    lp = processed_logprobs(logits, rows)
    assert torch.allclose(lp[0], torch.log_softmax(logits[0] / 0.5, -1))
    assert math.isinf(lp[1, 2]) and math.isinf(lp[1, 3]) and torch.allclose(lp[1, :2].exp().sum(), torch.tensor(1.0))
    assert torch.isfinite(lp[2]).sum() == 2  # 0.665 < 0.7: the token that crosses top_p stays
    assert lp[3, 0] == 0 and torch.isinf(lp[3, 1:]).all()  # greedy
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams.from_request({"repetition_penalty": 1.2})


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)


def _own_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1] / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1).tolist()


STEPS = pytest.mark.parametrize("static", [False, True], ids=["growing", "fixed"])
"""Both decode paths: a growing cache (CPU) and fixed-shape steps (the GPU's, CUDA graphs aside)."""


@STEPS
def test_completions_carry_the_models_own_logprobs_whatever_the_padding(model, static):
    gen = Generator(model, stop_ids=set(), max_model_len=512, static=static)
    prompts = [[5, 6, 7], list(range(10, 31))]  # left-padded together
    requests = [Request(f"r{i}", p, SamplingParams(max_tokens=9, temperature=0.7, n=3)) for i, p in enumerate(prompts)]
    results = gen.generate(requests)
    assert [len(r) for r in results] == [3, 3]
    for prompt, choices in zip(prompts, results):
        for c in choices:
            assert len(c.token_ids) == 9 and c.finish_reason == "length" and c.spans() == [("default", 0, 9)]
            assert c.logprobs == pytest.approx(_own_logprobs(model, prompt, c.token_ids, 0.7), abs=2e-4)


@STEPS
def test_stops_min_tokens_and_max_model_len(model, static):
    vocab = model.config.vocab_size
    gen = Generator(model, stop_ids=set(range(1, vocab)), max_model_len=12, static=static)  # every token but 0 stops
    (early,), (held,), (capped,) = gen.generate([
        Request("a", [1, 2], SamplingParams(max_tokens=5)),
        Request("b", [1, 2], SamplingParams(max_tokens=5, min_tokens=3)),
        Request("c", [1] * 8, SamplingParams(max_tokens=50, ignore_eos=True))])
    assert len(early.token_ids) == 1 and early.finish_reason == "stop"
    assert len(held.token_ids) == 4 and held.finish_reason == "stop"  # 3 tokens before a stop may come
    assert len(capped.token_ids) == 4 and capped.finish_reason == "length"  # 8 + 4 = max_model_len


def test_a_load_relabels_and_copies_the_weights(model):
    gen = Generator(model, stop_ids=set(), max_model_len=64)
    trained = type(model)(model.config)
    gen.load(trained, "7")
    assert gen.label == "7"
    assert all(torch.equal(a, b) for a, b in zip(gen.model.parameters(), trained.parameters()))
    assert not any(torch.equal(a, b) for a, b in zip(gen.model.parameters(), model.parameters()) if a.dim() == 2)
    trained.get_input_embeddings().weight.requires_grad_(False)  # frozen, as a LoRA trainer's base
    with torch.no_grad():
        trained.get_input_embeddings().weight.add_(1.0)
    gen.load(trained, "8")  # frozen weights never change in training: only trainable ones are copied
    assert not torch.equal(gen.model.get_input_embeddings().weight, trained.get_input_embeddings().weight)
    c = Choice(token_ids=[1, 2, 3], labels=["6", "6", "7"])
    assert c.spans() == [("6", 0, 2), ("7", 2, 3)]


async def test_rollouts_vllm_client_generates_from_the_routes(model, unused_tcp_port):
    gen = Generator(model, stop_ids=set(), max_model_len=128)
    serving = asyncio.create_task(gen.serve())
    runner = await server.start(gen, "tiny", "127.0.0.1", unused_tcp_port)
    try:
        async with aiohttp.ClientSession() as session:
            client = VLLMClient(f"http://127.0.0.1:{unused_tcp_port}", session, request_timeout=30)
            info = await client.handshake(10, min_version="0.26.0")
            assert info.has_generate and info.max_model_len == 128 and info.model == "tiny"
            outs = await asyncio.gather(*(client.generate_all([3, 4, 5], SamplingConfig(max_tokens=6, n=4), f"g{i}")
                                          for i in range(2)))
            assert [len(o) for o in outs] == [4, 4]
            assert all(len(c.token_ids) == 6 and c.spans == [("default", 0, 6)] for o in outs for c in o)
            assert await client.weight_label() == "default"
            async with session.post(f"http://127.0.0.1:{unused_tcp_port}/inference/v1/generate",
                                    json={"token_ids": [1], "sampling_params": {"logits_processors": []}}) as r:
                assert r.status == 400 and "not supported" in (await r.json())["error"]
    finally:
        await runner.cleanup()
        serving.cancel()


def test_sampling_follows_the_distribution():
    from agrpo.services.trainer.generation.sampling import sample

    probs = torch.tensor([[0.0, 0.2, 0.0, 0.8]])
    draws = sample(probs.log().expand(20000, 4), torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=4).float() / len(draws)
    assert counts[0] == 0 and counts[2] == 0 and abs(counts[1] - 0.2) < 0.02 and abs(counts[3] - 0.8) < 0.02


def test_the_copy_of_a_compiled_model_decodes_eager_with_its_own_weights(model):
    """The trainer compiles its decoder layers in place on a GPU; the generator's copy runs eager
    (no recompiles as decode shapes change) and never sees the trainer's later updates."""
    import copy

    trainer_model = copy.deepcopy(model)
    for layer in trainer_model.model.layers:
        layer.compile(backend="eager")
    gen = Generator(trainer_model, stop_ids=set(), max_model_len=512)
    assert all(m._compiled_call_impl is None for m in gen.model.modules())
    assert all(layer._compiled_call_impl is not None for layer in trainer_model.model.layers)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        before = gen.model(ids).logits
        for p in trainer_model.parameters():
            p.add_(1.0)
        after = gen.model(ids).logits
    assert torch.equal(before, after)


def test_fixed_shape_steps_sample_what_growing_ones_do(model):
    """Same seed, same requests (prompts of different lengths; no row finishes early, so both
    draw the same random numbers): the same tokens and logprobs from both decode paths. Batches
    of 6 and then 5 rows (of other prompts) share one fixed-shape decoder of 8 rows, which
    starts clean each time."""
    growing = Generator(model, stop_ids=set(), max_model_len=512, static=False)
    fixed = Generator(model, stop_ids=set(), max_model_len=512, static=True)
    for prompts, ns in (([[5, 6, 7], list(range(10, 40))], (3, 3)), ([list(range(50, 75)), [9]], (3, 2))):
        requests = [Request(f"r{i}", p, SamplingParams(max_tokens=12, temperature=0.9, n=n))
                    for i, (p, n) in enumerate(zip(prompts, ns))]  # both 42 -> 64 positions long
        want, got = growing.generate(requests), fixed.generate(requests)
        for w, g in zip((c for r in want for c in r), (c for r in got for c in r), strict=True):
            assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    assert list(fixed._decoders) == [(8, 64)]  # one decoder, reused


def test_a_kept_decoder_up_to_twice_a_batch_shape_serves_it():
    from agrpo.services.trainer.generation.static_decode import reusable

    kept = [(16, 128), (8, 96), (32, 512)]
    assert reusable(kept, 16, 60) == (16, 128)  # its own shape would be (16, 64)
    assert reusable(kept, 6, 42) == (8, 96)  # (16, 128) holds it too: the smallest wins
    assert reusable(kept, 16, 250) == (32, 512)  # own (16, 256): twice in both
    assert reusable(kept, 16, 200) is None  # own (16, 224): 512 positions are more than twice
    assert reusable(kept, 2, 42) is None  # own (2, 64): 8 rows are four times
    assert reusable(kept, 16, 130) is None  # own (16, 160): (16, 128) too short, (32, 512) over twice


def test_prompts_of_other_lengths_reuse_a_longer_decoder_and_sample_the_same(model):
    """A batch whose cache would be 64 positions runs on the kept 96-position decoder (masked
    positions change nothing it samples); one needing 32 positions gets its own decoder."""
    growing = Generator(model, stop_ids=set(), max_model_len=512, static=False)
    fixed = Generator(model, stop_ids=set(), max_model_len=512, static=True)
    for prompt in (list(range(10, 70)), list(range(20, 50)), [5, 6, 7]):  # need 72, 42, 15 positions
        requests = [Request("r", prompt, SamplingParams(max_tokens=12, temperature=0.9, n=6))]
        want, got = growing.generate(requests), fixed.generate(requests)
        for w, g in zip(want[0], got[0], strict=True):
            assert g.token_ids == w.token_ids
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    assert list(fixed._decoders) == [(8, 96), (8, 32)]


def test_a_graph_that_cannot_be_captured_means_eager_fixed_steps_and_one_warning(model, caplog, monkeypatch):
    import contextlib
    from types import SimpleNamespace

    stream = SimpleNamespace(wait_stream=lambda other: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: (_ for _ in ()).throw(RuntimeError("capture refused")))
    gen = Generator(model, stop_ids=set(), max_model_len=512, static=True)
    gen.graphs = True  # as on a GPU
    with caplog.at_level("WARNING"):
        (choices,) = gen.generate([Request("a", [5, 6, 7], SamplingParams(max_tokens=5, n=2))])
        gen.generate([Request("b", list(range(9, 60)), SamplingParams(max_tokens=5, n=2))])  # another shape
    assert [len(c.token_ids) for c in choices] == [5, 5] and gen.graphs is False and gen.static is True
    warned = [r.getMessage() for r in caplog.records if "CUDA graphs" in r.getMessage()]
    assert len(warned) == 1 and "capture refused" in warned[0]


def test_fixed_steps_that_fail_mean_a_growing_cache_and_one_warning(model, caplog, monkeypatch):
    from agrpo.services.trainer.generation import static_decode

    def broken(self, *args, **kw):
        raise TypeError("update() got an unexpected keyword argument")

    monkeypatch.setattr(static_decode.StaticKV, "update", broken)  # a transformers whose cache API differs
    gen = Generator(model, stop_ids=set(), max_model_len=512, static=True)
    with caplog.at_level("WARNING"):
        (choices,) = gen.generate([Request("a", [5, 6, 7], SamplingParams(max_tokens=5, n=2))])
        gen.generate([Request("b", [5, 6, 7], SamplingParams(max_tokens=5, n=2))])
    assert [len(c.token_ids) for c in choices] == [5, 5] and gen.static is False
    assert sum("growing cache" in r.getMessage() for r in caplog.records) == 1
