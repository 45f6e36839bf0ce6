"""A packed row's host data as device tensors, in one copy per dtype before the row's forward.

On a GPU a copy from pageable host memory waits for every kernel already queued. Tensors made
from a row's lists between its forward and its loss (labels, advantages, the term index) each
held the CPU until the forward had finished, so the GPU then idled while the CPU launched the
head, the loss and the backward. Here every list goes into one host buffer per dtype, pinned on
a GPU and copied asynchronously, before anything of the row is launched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

import torch

Data: TypeAlias = Sequence[int] | Sequence[float] | torch.Tensor


def to_device(device: torch.device, ints: Mapping[str, Data],
              floats: Mapping[str, Data] | None = None) -> dict[str, torch.Tensor]:
    """Each entry as a tensor on `device` (int64 / float32, CPU tensors keep their shape)."""
    out: dict[str, torch.Tensor] = {}
    for parts, dtype in ((ints, torch.long), (floats or {}, torch.float32)):
        if parts:
            out.update(_upload(parts, dtype, device))
    return out


def _upload(parts: Mapping[str, Data], dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    shapes = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else (len(v),) for k, v in parts.items()}
    flat = [torch.as_tensor(v, dtype=dtype).reshape(-1) for v in parts.values()]
    host = torch.cat(flat) if flat else torch.empty(0, dtype=dtype)
    if device.type == "cuda":
        host = host.pin_memory()
    buffer = host.to(device, non_blocking=True)
    sizes = [t.numel() for t in flat]
    return {k: piece.view(shapes[k]) for k, piece in zip(parts, buffer.split(sizes), strict=True)}
