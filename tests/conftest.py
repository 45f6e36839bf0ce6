"""Shared pytest fixtures: a cached tiny model and one vLLM server per session.

Markers (``vllm``, ``slow``, ``gpu``, ``e2e``) are registered in pyproject.toml;
deselect the server-backed tests with ``-m "not vllm"``. Shared helper modules live in
tests/support/, on the path through pytest's `pythonpath` setting.
"""

from __future__ import annotations

import os
from pathlib import Path

# Before torch is imported anywhere: on 2 cores the vLLM engine pins one core,
# so keep the test process's torch from oversubscribing the machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

from vllm_server import VLLMServer

REPO_ROOT = Path(__file__).resolve().parents[1]

# Built models are cached across runs (they are deterministic, and keyed by a marker
# file holding their parameters). Set AGRPO_TINY_MODEL_CACHE to move the cache.
TINY_CACHE = Path(os.environ.get("AGRPO_TINY_MODEL_CACHE") or REPO_ROOT / ".cache" / "tiny-model")

_SERVER_NOTES: list[str] = []


def pytest_terminal_summary(terminalreporter):
    for note in _SERVER_NOTES:  # start-up time is worth seeing on every run
        terminalreporter.write_line(note)


@pytest.fixture(scope="session")
def tiny_model_factory():
    """``tiny_model_factory(seed) -> Path``: the tiny model for that seed (built once)."""
    from agrpo.demo.tiny_model import make_tiny_model

    return lambda seed=0: make_tiny_model(TINY_CACHE / f"seed{seed}", seed=seed)


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_factory) -> Path:
    return tiny_model_factory(0)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir):
    """One vLLM server for the whole session, serving the seed-0 tiny model.

    Tests that change its state (weights, pause) must restore it before returning.
    """
    server = VLLMServer(tiny_model_dir).start()
    _SERVER_NOTES.append(f"vllm_server: healthy after {server.startup_s:.1f} s (log: {server.log_path})")
    try:
        yield server
    finally:
        server.stop()
