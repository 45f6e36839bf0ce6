"""The trainer's own generator on a GPU: fixed-shape steps replayed as CUDA graphs sample from
the model's own distribution, and a weight load between two batches reaches the graph."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def gpu_model(tiny_gpu_model):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_gpu_model), dtype=torch.float32).cuda()


def _own_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    import torch

    ids = torch.tensor([prompt + completion], device="cuda")
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion, device="cuda").unsqueeze(1)).squeeze(1).tolist()


def test_graphs_sample_from_the_models_own_distribution_and_follow_a_load(gpu_model):
    import copy

    import torch

    from agrpo.services.trainer.generation.generator import Generator, Request
    from agrpo.services.trainer.generation.sampling import SamplingParams

    gen = Generator(gpu_model, stop_ids=set(), max_model_len=512)
    assert gen.static and gen.graphs  # the GPU default
    prompts = [[5, 6, 7], list(range(10, 31))]
    for round_ in range(2):  # the second batch reuses the captured graph, after a weight load
        if round_:
            trained = copy.deepcopy(gpu_model)
            with torch.no_grad():
                for p in trained.parameters():
                    p.mul_(1.01)
            gen.load(trained, "2")
        reference = trained if round_ else gpu_model
        results = gen.generate([Request(f"r{i}", p, SamplingParams(max_tokens=9, n=3)) for i, p in enumerate(prompts)])
        assert gen.graphs, "the capture fell back to eager steps"
        for prompt, choices in zip(prompts, results):
            for c in choices:
                assert len(c.token_ids) == 9
                assert c.logprobs == pytest.approx(_own_logprobs(reference, prompt, c.token_ids), abs=2e-3)


def test_decoding_runs_on_its_own_stream_and_waits_for_a_load_still_queued_on_the_trainers(gpu_model):
    import copy

    import torch

    from agrpo.services.trainer.generation.generator import Generator, Request
    from agrpo.services.trainer.generation.sampling import SamplingParams

    gen = Generator(gpu_model, stop_ids=set(), max_model_len=512)
    streams = []
    gen.model.register_forward_pre_hook(lambda *_: streams.append(torch.cuda.current_stream()))
    prompt = [5, 6, 7, 8]
    gen.generate([Request("warm", prompt, SamplingParams(max_tokens=4, n=2))])
    trained = copy.deepcopy(gpu_model)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # the trainer's stream stays busy for a while, with this queued behind:
    with torch.no_grad():
        for p in trained.parameters():
            p.mul_(1.05)
    gen.load(trained, "2")  # a copy queued behind the update, on the trainer's stream
    (choices,) = gen.generate([Request("r", prompt, SamplingParams(max_tokens=9, n=3))])
    assert streams and all(s != torch.cuda.default_stream() for s in streams)
    for c in choices:
        assert c.labels == ["2"] * 9
        assert c.logprobs == pytest.approx(_own_logprobs(trained, prompt, c.token_ids), abs=2e-3)
