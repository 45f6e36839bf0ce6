"""GPU tests: marked `gpu`, skipped where torch sees no CUDA device (CI is CPU-only).

Run them on a GPU box with scripts/gpu/run_gpu_tests.sh. Tests that need two GPUs skip
on one; the NcclLib tests skip until the trainer carries the NCCL patch (docs/gpu.md).
"""
from __future__ import annotations

import pytest


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    here = str(config.rootpath / "tests" / "gpu")
    n = _cuda_devices()
    for item in items:
        if not str(item.fspath).startswith(here):
            continue
        item.add_marker(pytest.mark.gpu)
        if n == 0:
            item.add_marker(pytest.mark.skip(reason="no CUDA device"))
        elif item.get_closest_marker("two_gpus") is not None and n < 2:
            item.add_marker(pytest.mark.skip(reason="needs 2 CUDA devices"))


def pytest_configure(config):
    config.addinivalue_line("markers", "two_gpus: needs 2 CUDA devices (tests/gpu only)")


@pytest.fixture(scope="session")
def tiny_gpu_model(tmp_path_factory):
    """A tiny random Qwen2 (scripts/gpu/make_tiny.py preset 'tiny') in a temp folder."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path_factory.mktemp("tiny_gpu")
    subprocess.run([sys.executable, str(root / "scripts" / "gpu" / "make_tiny.py"), str(out / "m"), str(out / "t")],
                   check=True, capture_output=True)
    return out / "m"
