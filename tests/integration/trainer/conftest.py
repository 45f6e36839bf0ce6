"""Fixtures for trainer integration tests (helpers live in trainer_helpers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_helpers import restore_server  # noqa: E402


@pytest.fixture
def shared_vllm(vllm_server, tiny_model_dir):
    """The session vLLM server; its seed weights and label are restored afterwards."""
    yield vllm_server
    restore_server(vllm_server, tiny_model_dir)
