"""Tests import the vLLM launcher from here; it lives in services/common/vllm_process.py."""

from agrpo.services.common.ports import free_port  # noqa: F401
from agrpo.services.common.vllm_process import REPO_ROOT, VLLMServer, vllm_python  # noqa: F401
