"""Fixtures for the trainer's unit tests: sample factories and a tiny trainable engine."""

from __future__ import annotations

import random

import pytest

from agrpo.services.trainer.sample import Sample


def _sample(sid: str, group: str, prompt: list[int], completion: list[int], *, key=(0, 0), version=0,
            adv=0.5, old=-2.0, size=0, producer="") -> Sample:
    ids = list(prompt) + list(completion)
    mask = [0] * len(prompt) + [1] * len(completion)
    return Sample(sid, group, key, version, ids, mask, [old if m else 0.0 for m in mask], adv,
                  group_size=size, producer_id=producer, prompt_length=len(prompt))


@pytest.fixture
def make_sample():
    """make_sample(sid, group, prompt_ids, completion_ids, key=, version=, adv=, old=, size=, producer=)."""
    return _sample


@pytest.fixture
def make_groups():
    """make_groups(n_groups, group_size, prompt_len, seed) -> samples sharing prompts per group."""
    def build(n_groups=2, size=4, prompt_len=8, seed=0, vocab=1000, max_completion=6):
        rng = random.Random(seed)
        out = []
        for g in range(n_groups):
            prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
            for k in range(size):
                comp = [rng.randrange(3, vocab) for _ in range(rng.randrange(2, max_completion + 1))]
                out.append(_sample(f"g{g}s{k}", f"g{g}", prompt, comp, key=(g, 0), adv=rng.uniform(-1, 1),
                                   old=-rng.uniform(3, 8)))
        return out
    return build
