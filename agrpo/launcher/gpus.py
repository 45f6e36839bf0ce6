"""Which GPUs a job's vLLM server and trainer ranks get, decided before anything starts.

No CUDA import: the count comes from `nvidia-smi -L`. The trainer's devices default to the
GPUs vLLM does not use (the first trainer.num_processes of them; all for 0), or vLLM's own
GPU on a one-GPU machine (they share it: vLLM takes launcher.gpu_memory_utilization of it).
"""

from __future__ import annotations

import shutil
import subprocess

from agrpo.services.common.preflight import StartupError


def gpu_count() -> int:
    """GPUs that nvidia-smi lists (0 without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def _indices(key: str, value: str, count: int) -> list[int]:
    try:
        ids = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise StartupError(f"{key}={value!r}: a comma-separated list of GPU indices, e.g. '1,2'") from None
    bad = [i for i in ids if not 0 <= i < count]
    if not ids or bad:
        raise StartupError(f"{key}={value!r}: this machine has {count} GPU(s), indices 0..{count - 1}")
    return ids


def trainer_devices(cfg, count: int) -> str:
    """CUDA_VISIBLE_DEVICES of the trainer's ranks on a machine with `count` GPUs."""
    launch, ranks = cfg.launcher, cfg.trainer.num_processes
    vllm = _indices("launcher.vllm_gpu", launch.vllm_gpu, count)
    if launch.trainer_gpus is not None:
        ids = _indices("launcher.trainer_gpus", launch.trainer_gpus, count)
    else:
        ids = [i for i in range(count) if i not in vllm] or vllm
    ranks = ranks or len(ids)  # 0: one rank per GPU it gets
    if len(ids) < ranks:
        raise StartupError(f"trainer.num_processes={ranks}: one GPU per rank, and launcher.trainer_gpus "
                           f"gives {len(ids)} ({','.join(map(str, ids))}) of this machine's {count}")
    return ",".join(map(str, ids[:ranks]))
