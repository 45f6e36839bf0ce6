"""CUDA IPC weight transport: vLLM and the trainer share one GPU (colocated).

Why: NCCL refuses two ranks of one communicator on the same device, so on a one-GPU machine
the weights cannot be broadcast. Here the trainer copies them (in the wire dtype) into one flat
buffer it owns, shares that buffer once through CUDA IPC (torch's `reduce_tensor`, i.e.
cudaIpcGetMemHandle), and sends our vLLM worker extension only the handle and a manifest, as
JSON (`agrpo_load_ipc`). The worker opens the handle once, views each tensor in place and
loads them directly (no layerwise reload, as the NCCL direct load). vLLM's own `ipc` backend
pickles the handles (it needs VLLM_ALLOW_INSECURE_SERIALIZATION) and imports Ray; this needs
neither. The pause(keep) -> load -> reset -> label -> resume phases are the direct load's
(orchestrator.py).

Wire format (decoded by vllm_plugin/agrpo_vllm_plugin/ipc.py; a unit test round-trips it):
{"buffer": {"uuid", "nbytes", "handle", "storage_size", "storage_offset", "ref_counter_handle",
"ref_counter_offset", "event_handle", "event_sync_required"}, "names", "dtype_names", "shapes",
"offsets"}: bytes are base64, offsets are byte offsets into the buffer, each a multiple of
ALIGN. The buffer is a snapshot: training may change the parameters once `prepare` returns,
and the next `prepare` reuses the buffer only after the server has loaded from it (syncs are
sequential).
"""

from __future__ import annotations

import base64
import json
import time

import torch

from .base import Prepared, WeightTransport
from .client import IPC_CHECK, IPC_LOAD, VLLMAdmin, WeightSyncError
from .transports import gpu_uuid, manifest

ALIGN = 256  # bytes: every tensor starts on a boundary any dtype (and any kernel) accepts


def byte_offsets(nbytes: list[int], align: int = ALIGN) -> tuple[list[int], int]:
    """Where each tensor starts in the flat buffer, and the buffer's size."""
    offsets, end = [], 0
    for n in nbytes:
        start = -(-end // align) * align
        offsets.append(start)
        end = start + n
    return offsets, end


def pack_into(buffer: torch.Tensor, named: list[tuple[str, torch.Tensor]], offsets: list[int]) -> None:
    """Copy each (contiguous) tensor's bytes to its offset in the flat uint8 `buffer`."""
    for (_, t), start in zip(named, offsets):
        raw = t.reshape(-1).view(torch.uint8)
        buffer[start:start + raw.numel()].copy_(raw)


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode("ascii")


def share_fields(ipc_args: tuple, uuid: str) -> dict:
    """The JSON form of `reduce_tensor(buffer)[1]` for a flat uint8 CUDA buffer."""
    (_cls, size, _stride, _offset, _storage_cls, _dtype, _device, handle, storage_size, storage_offset,
     _grad, ref_counter_handle, ref_counter_offset, event_handle, event_sync_required) = ipc_args
    return {"uuid": uuid, "nbytes": int(size[0]), "handle": _b64(handle), "storage_size": int(storage_size),
            "storage_offset": int(storage_offset), "ref_counter_handle": _b64(ref_counter_handle),
            "ref_counter_offset": int(ref_counter_offset), "event_handle": _b64(event_handle),
            "event_sync_required": bool(event_sync_required)}


class IpcTransport(WeightTransport):
    """One shared buffer per trainer; each version is copied into it and loaded from it."""

    name = "ipc"
    carries_adapters = True  # the worker copies the adapter out of the buffer
    direct_only = True  # no vLLM load flow: only our worker extension opens the handle
    needs_gpu = True

    @classmethod
    def from_config(cls, cfg, device: torch.device) -> IpcTransport:
        return cls()

    def __init__(self, uuid: str | None = None) -> None:
        self.uuid = uuid  # this trainer's GPU (None: the current device's, asked at init)
        self._buffer: torch.Tensor | None = None
        self._share: dict | None = None
        self.last: dict[str, float] = {}

    async def init(self, admin: VLLMAdmin) -> None:
        """Every worker of the server must sit on this GPU and accept a direct load."""
        self.uuid = self.uuid or gpu_uuid()
        results = await admin.rpc("init", IPC_CHECK, self.uuid)
        refusals = [r.get("why", "?") for r in results if not (isinstance(r, dict) and r.get("ok"))]
        if refusals or not results:
            raise WeightSyncError("init", admin.url, "trainer.weight_transport=ipc: " +
                                  ("; ".join(refusals) or "no worker answered"))

    def _buffer_for(self, size: int) -> torch.Tensor:
        if self._buffer is None or self._buffer.numel() < size:
            from torch.multiprocessing.reductions import reduce_tensor

            self._buffer = None  # free the old one first: a model's worth of memory
            self._buffer = torch.empty(size, dtype=torch.uint8, device=torch.cuda.current_device())
            self._share = share_fields(reduce_tensor(self._buffer)[1], self.uuid or gpu_uuid())
        return self._buffer

    def prepare(self, named: list[tuple[str, torch.Tensor]], version: int) -> Prepared:
        t0 = time.perf_counter()
        offsets, total = byte_offsets([t.numel() * t.element_size() for _, t in named])
        buffer = self._buffer_for(total)
        pack_into(buffer, named, offsets)
        torch.cuda.current_stream().synchronize()  # the server reads it from another process
        assert self._share is not None  # _buffer_for() shares every buffer it makes
        info = {"buffer": dict(self._share, nbytes=buffer.numel()), **manifest(named), "offsets": offsets}
        self.last = {"copy_s": time.perf_counter() - t0}
        return Prepared(version, [info], nbytes=total)

    async def send(self, admin: VLLMAdmin, prepared: Prepared) -> None:
        t0 = time.perf_counter()
        admin.last_rpc = await admin.rpc("update", IPC_LOAD, json.dumps(prepared.update_infos[0]))
        self.last["server_s"] = time.perf_counter() - t0

    def close(self) -> None:
        self._buffer = self._share = None
