"""LoRA adapters that arrive through the trainer's weight transports, with no folder shared with it.

Why a folder of this server's own: vLLM loads an adapter from a path, and loads it again from
that path when its LRU cache evicted it and a request names it once more. The trainer's tensors
are written as they arrived into a folder on this server's machine (``AGRPO_LORA_DIR``, by
default under /dev/shm, which is memory), so vLLM's own loader reads them and a reload after an
eviction reads the same pristine tensors. Reloading from tensors staged in memory instead would
hand vLLM tensors it had already scaled in place (it folds lora_alpha / r into lora_B when it
loads), and the adapter would act twice as strong.
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

PREFIX = "agrpo-v"
"""Adapter names are PREFIX + policy version (services/common/versions.py adapter_name)."""


def lora_root() -> Path:
    """Where this server keeps the adapters it was sent: AGRPO_LORA_DIR (agrpo's own server
    handle sets it and removes it at stop), else a folder of this server in /dev/shm."""
    if os.environ.get("AGRPO_LORA_DIR"):
        return Path(os.environ["AGRPO_LORA_DIR"])
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return Path(base) / f"agrpo-lora-{os.getppid()}"


def lora_info(vllm_config) -> dict:
    """What the trainer checks before it syncs adapters instead of merged weights."""
    cfg = vllm_config.lora_config
    if cfg is None:
        return {"enabled": False}
    runtime = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")
    return {"enabled": True, "runtime_updating": runtime, "max_lora_rank": int(cfg.max_lora_rank),
            "max_loras": int(cfg.max_loras), "max_cpu_loras": int(cfg.max_cpu_loras or cfg.max_loras),
            "data_parallel_size": int(vllm_config.parallel_config.data_parallel_size)}


def transport_tensors(infos: list[dict]) -> dict:
    """The adapter's tensors from the http or shared_path transport's chunks: inline base64
    safetensors or a path. (CUDA IPC chunks are read by the worker: worker.py.)"""
    from safetensors.torch import load, load_file

    out: dict = {}
    for info in infos:
        if info.get("safetensors_b64") is not None:
            out.update(load(base64.b64decode(info["safetensors_b64"])))
        else:
            path = Path(os.path.expanduser(info["path"]))
            for f in [path] if path.is_file() else sorted(path.glob("*.safetensors")):
                out.update(load_file(str(f)))
    return out


def stage(name: str, config_json: str, tensors: Callable[[], dict], keep: int) -> str:
    """Write adapter `name` (its peft adapter_config and `tensors()`, on the CPU) where vLLM can
    load it; drop the adapters more than `keep` versions older. Returns the folder. Idempotent:
    every worker of the server calls it, and a re-sync of the same version finds it written."""
    from safetensors.torch import save_file

    root = lora_root()
    target = root / name
    if not root.exists():
        atexit.register(shutil.rmtree, root, True)  # /dev/shm outlives the server otherwise
    if not target.exists():
        tmp = root / f".{name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "adapter_config.json").write_text(config_json)
        save_file(tensors(), str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        try:
            tmp.rename(target)
        except OSError:  # another worker got there first
            shutil.rmtree(tmp, ignore_errors=True)
    _prune(root, _version(name) - keep)
    return str(target)


def _version(name: str) -> int:
    try:
        return int(name.removeprefix(PREFIX))
    except ValueError:
        return -1


def _prune(root: Path, oldest_kept: int) -> None:
    for folder in root.glob(f"{PREFIX}*"):
        if 0 <= _version(folder.name) < oldest_kept:
            shutil.rmtree(folder, ignore_errors=True)
