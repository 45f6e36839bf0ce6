"""Open the trainer's CUDA IPC weight buffer inside a vLLM worker (colocated on one GPU).

The wire format is written by services/trainer/weight_sync/ipc.py (its docstring): JSON, no
pickle. The buffer is opened once per handle and kept: the trainer reuses it for every
version, and re-opening an IPC handle costs a driver call each time.
"""

from __future__ import annotations

import base64

import torch


def _raw(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def rebuild_args(share: dict, device_index: int) -> tuple:
    """`rebuild_cuda_tensor`'s arguments for the flat uint8 buffer, on this worker's device."""
    n = int(share["nbytes"])
    return (torch.Tensor, torch.Size([n]), (1,), 0, torch.storage.TypedStorage, torch.uint8, device_index,
            _raw(share["handle"]), int(share["storage_size"]), int(share["storage_offset"]), False,
            _raw(share["ref_counter_handle"]), int(share["ref_counter_offset"]), _raw(share["event_handle"]),
            bool(share["event_sync_required"]))


def views(buffer: torch.Tensor, info: dict) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every entry of the manifest: views into `buffer`, no copy."""
    out = []
    for name, dtype_name, shape, start in zip(info["names"], info["dtype_names"], info["shapes"], info["offsets"]):
        dtype = getattr(torch, dtype_name)
        numel = 1
        for d in shape:
            numel *= int(d)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        out.append((name, buffer[start:start + nbytes].view(dtype).view(shape)))
    return out


class OpenBuffer:
    """The one buffer this worker has open (a new handle replaces it: a restarted trainer)."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.tensor: torch.Tensor | None = None

    def get(self, share: dict, device_index: int) -> torch.Tensor:
        if self.key != share["handle"] or self.tensor is None or self.tensor.numel() != int(share["nbytes"]):
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            self.tensor = None
            self.tensor = rebuild_cuda_tensor(*rebuild_args(share, device_index))
            self.key = share["handle"]
        return self.tensor
