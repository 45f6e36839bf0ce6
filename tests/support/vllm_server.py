"""Tests import the vLLM launcher from here; it lives in services/common/vllm_process.py."""

from agrpo.services.common.vllm_process import REPO_ROOT, VLLMServer, free_port, vllm_python  # noqa: F401
