"""Tests import the vLLM launcher from here; it lives in agrpo/launcher/vllm_process.py."""

from agrpo.launcher.vllm_process import REPO_ROOT, VLLMServer, vllm_python  # noqa: F401
from agrpo.services.common.ports import free_port  # noqa: F401
