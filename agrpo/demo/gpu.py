"""`agrpo demo --gpu`: vLLM on one GPU and the trainer on another (NCCL weight sync), or
both on one GPU (`--trainer-gpu` = `--vllm-gpu`: CUDA IPC weight sync, vLLM taking
`--gpu-memory-utilization` of it).

Pure settings (no torch, no vLLM import): the vLLM start profile, each service's
environment and the trainer's config overrides. Why IPC on one GPU: NCCL refuses two ranks
of one communicator on the same GPU, and the trainer is rank 0 of vLLM's weight-transfer
group. Reward and rollout stay on the CPU (CUDA_VISIBLE_DEVICES="").
"""

from __future__ import annotations

from dataclasses import dataclass

from agrpo.launcher.vllm_process import NCCL_SAFE_ENV, WORKER_EXTENSION, GpuProfile

H200_BF16_TFLOPS = 989.0  # dense bf16 peak, for perf/mfu
# The tiny model's head dim is hidden/4. The carried vLLM keeps only FlashAttention 3,
# which was run on the H200s with head dim 64 (scripts/gpu/make_tiny.py's tiny); the CPU
# demo's 32 was never tried there.
TINY_HIDDEN_SIZE = 256


@dataclass(frozen=True)
class GpuOptions:
    """Which GPU each side uses and how vLLM is started there."""

    vllm_gpu: str = "0"
    trainer_gpu: str = "1"
    gpu_memory_utilization: float = 0.25
    kv_cache_gib: float | None = None
    """None: sized for the job (agrpo/launcher/vllm_plan.kv_cache_gib); 0: what gpu_memory_utilization leaves."""
    worker_extension: str | None = WORKER_EXTENSION
    dtype: str = "bfloat16"
    peak_tflops: float | None = H200_BF16_TFLOPS
    vllm_startup_s: float = 420.0

    @property
    def colocated(self) -> bool:
        """vLLM and the trainer on one GPU: weights go through CUDA IPC, not NCCL."""
        return self.vllm_gpu == self.trainer_gpu

    def __post_init__(self) -> None:
        if self.colocated and not self.worker_extension:
            raise ValueError("vLLM and the trainer on one GPU load weights through our worker extension "
                             "(CUDA IPC): --worker-extension none needs two GPUs (NCCL)")


def default_trainer_gpu(vllm_gpu: str, count: int) -> str:
    """The trainer's GPU when none is given: the first GPU vLLM does not use, or vLLM's own on
    a one-GPU machine (colocated). `count` 0 (no nvidia-smi): the two-GPU default."""
    if count:
        others = [str(i) for i in range(count) if str(i) != vllm_gpu]
        return others[0] if others else vllm_gpu
    return "1" if vllm_gpu != "1" else "0"


def vllm_profile(opts: GpuOptions, scale_out: bool, max_model_len: int, kv_cache_gib: float) -> GpuProfile:
    """The bf16 / NCCL start profile for VLLMServer (max_model_len and the KV cache from the job's
    config: agrpo/launcher/vllm_plan.py)."""
    return GpuProfile(gpu=opts.vllm_gpu, gpu_memory_utilization=opts.gpu_memory_utilization,
                      kv_cache_gib=kv_cache_gib if opts.kv_cache_gib is None else opts.kv_cache_gib,
                      max_model_len=max_model_len,
                      worker_extension=opts.worker_extension, scale_out=scale_out)


def service_env(service: str, opts: GpuOptions | None) -> dict[str, str]:
    """Extra environment of one `agrpo <service>` process ({} on CPU)."""
    if opts is None:
        return {}
    return {**NCCL_SAFE_ENV, "CUDA_VISIBLE_DEVICES": opts.trainer_gpu if service == "trainer" else ""}


def config_overrides(opts: GpuOptions | None) -> dict:
    """Top-level keys and trainer-section keys of this mode.

    GPU: the model loads in `dtype` with bf16 autocast; weights go over NCCL (CUDA IPC on one
    GPU) as bf16, the server's dtype, whatever the training dtype. `weight_load` is "vllm" where a
    direct load cannot happen (no worker extension, or CPU, where the extension refuses): no probe. On CPU
    the demo's own vLLM reads the trainer's files, so weights go as a file per version
    (shared_path), not as base64 JSON over HTTP: runner.write_config sets that (or local, where
    the trainer generates itself)."""
    if opts is None:
        return {"trainer": {"weight_load": "vllm"}}
    trainer = {"weight_transport": "ipc" if opts.colocated else "nccl", "sync_dtype": "bfloat16",
               "weight_load": "auto" if opts.worker_extension else "vllm"}
    if opts.peak_tflops:
        trainer["peak_tflops"] = opts.peak_tflops
    return {"dtype": opts.dtype, "bf16": True, "trainer": trainer}
