"""Fixtures for trainer integration tests (helpers live in tests/support/trainer_helpers.py)."""

from __future__ import annotations

import pytest

from trainer_helpers import restore_server


@pytest.fixture
def shared_vllm(vllm_server, tiny_model_dir):
    """The session vLLM server; its seed weights and label are restored afterwards."""
    yield vllm_server
    restore_server(vllm_server, tiny_model_dir)
