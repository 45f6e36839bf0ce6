"""A packed row's host data as device tensors, in one copy per dtype before the row's forward.

On a GPU a copy from pageable host memory waits for every kernel already queued. Tensors made
from a row's lists between its forward and its loss (labels, advantages, the term index) each
held the CPU until the forward had finished, so the GPU then idled while the CPU launched the
head, the loss and the backward. Here every list goes into one host buffer per dtype, pinned on
a GPU and copied asynchronously, before anything of the row is launched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate
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


ALIGN_BYTES = 16
"""Each piece starts at a multiple of this (compiled kernels assume aligned inputs, else copy them)."""


def _upload(parts: Mapping[str, Data], dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    shapes = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else (len(v),) for k, v in parts.items()}
    flat = [torch.as_tensor(v, dtype=dtype).reshape(-1) for v in parts.values()]
    step = ALIGN_BYTES // flat[0].element_size()
    slots = [-(-t.numel() // step) * step for t in flat]
    host = torch.zeros(sum(slots), dtype=dtype, pin_memory=device.type == "cuda")
    starts = list(accumulate(slots[:-1], initial=0))
    for t, start in zip(flat, starts, strict=True):
        host[start:start + t.numel()] = t
    buffer = host.to(device, non_blocking=True)
    return {k: buffer[start:start + t.numel()].view(shapes[k]) for k, t, start in zip(parts, flat, starts, strict=True)}
