"""Worker extension for a direct weight load (vLLM ``--worker-extension-cls``).

Why: vLLM's RL flow loads an update between ``start_weight_update`` and
``finish_weight_update``, which wrap every layer's weight loader (layerwise reload)
so quantized or repacked layers are re-processed once all their tensors arrived.
That machinery costs a fixed amount per tensor whatever the model size, on an H200 many times
the NCCL transfer itself (docs/gpu.md, "How vLLM loads an update"). For an unquantized model
on CUDA the tensors ``model.load_weights`` writes *are* the ones the forward reads,
so loading them directly is exact and skips that cost.

The trainer calls these methods through ``POST /collective_rpc`` (dev mode). The
engine runs a collective RPC between two scheduler steps, so no forward ever sees a
half-written model; the trainer still pauses the scheduler around it so in-flight
requests are preempted and recomputed under the new weights (see
services/trainer/weight_sync/orchestrator.py). String arguments only: vLLM's HTTP
route passes nothing else.

With the trainer on vLLM's own GPU (one-GPU machines), NCCL cannot connect the two, and
``agrpo_load_ipc`` loads the same way from a buffer the trainer shares through CUDA IPC
(agrpo_vllm_plugin/ipc.py); no weight-transfer engine is needed for it.

Start vLLM with
``--worker-extension-cls agrpo_vllm_plugin.worker.AgrpoWorkerExtension``.
"""

import json
import time


def direct_load_blocker(worker, needs_engine: bool = True) -> str | None:
    """Why a direct load would be wrong on this worker, or None when it is exact. The NCCL
    load receives through vLLM's transfer engine; the IPC load needs none."""
    if needs_engine and getattr(worker, "weight_transfer_engine", None) is None:
        return "no weight-transfer engine: start vLLM with --weight-transfer-config"
    device = getattr(worker, "device", None)
    if getattr(device, "type", None) != "cuda":
        return (f"device {device}: CPU layers repack their weights after loading, "
                "which only vLLM's layerwise reload redoes")
    quant = worker.vllm_config.model_config.quantization
    if quant:
        return f"quantized model ({quant}): loaded tensors are post-processed"
    return None


def _device_index(worker) -> int:
    import torch

    index = worker.device.index
    return torch.cuda.current_device() if index is None else index


class AgrpoWorkerExtension:
    """Mixed into vLLM's worker class; every method runs on every worker."""

    def agrpo_direct_load_check(self) -> dict:
        """{"ok": bool, "why": str}: may this worker load updates directly?"""
        why = direct_load_blocker(self)
        return {"ok": why is None, "why": why or ""}

    def agrpo_lora_info(self) -> dict:
        """Whether this server can take adapters at run time, and its LoRA limits (adapters.py)."""
        from .adapters import lora_info

        return lora_info(self.vllm_config)

    def agrpo_stage_adapter(self, name: str, config_json: str, infos_json: str, keep: str) -> dict:
        """Write adapter `name` from the transport's chunks into this server's own folder, for
        /v1/load_lora_adapter to load (adapters.py); {"path", "stage_s"}."""
        from .adapters import stage, transport_tensors

        t0 = time.perf_counter()
        infos = json.loads(infos_json)
        ipc = bool(infos) and "buffer" in infos[0]
        path = stage(name, config_json, (lambda: self._agrpo_ipc_copy(infos[0])) if ipc
                     else (lambda: transport_tensors(infos)), int(keep))
        return {"path": path, "stage_s": time.perf_counter() - t0}

    def agrpo_load_weights(self, update_info_json: str) -> dict:
        """Receive one update through the configured transfer engine and load it as-is.

        ``update_info_json`` is the JSON of the backend's usual ``update_info`` (for
        nccl: names, dtype_names, shapes, packed...). Returns timings for the trainer.
        """
        import torch

        why = direct_load_blocker(self)
        if why is not None:
            raise RuntimeError(f"direct weight load refused: {why}")
        engine = self.weight_transfer_engine
        t0 = time.perf_counter()
        info = engine.parse_update_info(json.loads(update_info_json))
        engine.receive_weights(info)
        torch.cuda.synchronize()
        return {"load_s": time.perf_counter() - t0, "tensors": len(getattr(info, "names", []) or [])}

    def agrpo_ipc_check(self, trainer_gpu_uuid: str) -> dict:
        """{"ok", "why", "uuid"}: may this worker load from the trainer's CUDA IPC buffer? Only
        on the trainer's own GPU (an IPC handle opens on the GPU it was made on)."""
        import torch

        why = direct_load_blocker(self, needs_engine=False)
        uuid = str(torch.cuda.get_device_properties(_device_index(self)).uuid) if why is None else ""
        if why is None and uuid != trainer_gpu_uuid:
            why = f"vLLM worker on GPU {uuid}, the trainer on GPU {trainer_gpu_uuid}: CUDA IPC needs one GPU"
        return {"ok": why is None, "why": why or "", "uuid": uuid}

    def _agrpo_ipc_buffer(self, info: dict):
        """The trainer's CUDA IPC buffer that `info` names, opened once per handle (ipc.py)."""
        from .ipc import OpenBuffer

        if not hasattr(self, "_agrpo_ipc"):
            self._agrpo_ipc = OpenBuffer()
        return self._agrpo_ipc.get(info["buffer"], _device_index(self))

    def _agrpo_ipc_copy(self, info: dict) -> dict:
        """CPU copies of the tensors `info` lays out in the trainer's IPC buffer (a LoRA adapter:
        vLLM loads adapters from files). Copied before returning: the trainer reuses the buffer."""
        from .ipc import views

        why = direct_load_blocker(self, needs_engine=False)
        if why is not None:
            raise RuntimeError(f"CUDA IPC refused: {why}")
        return {name: t.to("cpu", copy=True) for name, t in views(self._agrpo_ipc_buffer(info), info)}

    def agrpo_load_ipc(self, update_info_json: str) -> dict:
        """Load one version from the trainer's IPC buffer (services/trainer/weight_sync/ipc.py)
        as-is; the trainer reuses the buffer once this returns, so it synchronizes first."""
        import torch

        from .ipc import views

        why = direct_load_blocker(self, needs_engine=False)
        if why is not None:
            raise RuntimeError(f"direct weight load refused: {why}")
        t0 = time.perf_counter()
        info = json.loads(update_info_json)
        buffer = self._agrpo_ipc_buffer(info)
        opened = time.perf_counter()
        self.get_model().load_weights(views(buffer, info))
        torch.cuda.synchronize()
        end = time.perf_counter()
        return {"load_s": end - t0, "open_s": opened - t0, "tensors": len(info["names"])}
