"""NCCL weight transport written to vLLM's protocol (GPU only; no vLLM import).

Protocol facts (reference/vllm-rl-api.md §2):
- The trainer is rank 0; vLLM workers are ranks 1..W (rank_offset 1), world = W + 1.
- Packed mode: tensors in manifest order, flattened to uint8 and concatenated until
  the running size *exceeds* the buffer size (the crossing tensor stays in that
  chunk); one broadcast per chunk. Both sides derive the same boundaries from the
  manifest, so order, shapes, dtypes and buffer size must agree.
- vLLM < 0.28: "packed" (+ buffer settings) travel in update_info.
  vLLM >= 0.28: they move to init_info; update_info is only {names, dtype_names, shapes}
  and any extra key is rejected.
- vLLM >= 0.30 accepts `nccl_unique_id_b64` (base64 of the 128-byte ncclUniqueId), so
  the trainer side needs only torch's own NCCL bindings. Older servers rendezvous
  through vLLM's TCPStore with a pickled vLLM object: not supported here (clear error).
Pure functions (metadata, chunk plan, payloads) are unit-tested on CPU; the sender is
verified on GPUs by the GPU issue.
"""

from __future__ import annotations

import asyncio
import base64
import math
import re
from dataclasses import dataclass

import torch

from .client import VLLMAdmin
from .transports import Prepared

DEFAULT_BUFFER_BYTES = 1 << 30
DEFAULT_NUM_BUFFERS = 2


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.33.0', '0.28.1.dev12+g..', 'v0.30' -> (major, minor, patch)."""
    nums = [int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3]]
    while len(nums) < 3:
        nums.append(0)
    return tuple(nums)  # type: ignore[return-value]


@dataclass(frozen=True)
class NcclProtocol:
    """Which variant of vLLM's NCCL weight-transfer protocol a server speaks."""

    packed_in_init: bool   # >= 0.28
    unique_id_b64: bool    # >= 0.30

    @classmethod
    def for_version(cls, version: str) -> "NcclProtocol":
        v = parse_version(version)
        return cls(packed_in_init=v >= (0, 28, 0), unique_id_b64=v >= (0, 30, 0))


def manifest(named: list[tuple[str, torch.Tensor]]) -> dict[str, list]:
    """{names, dtype_names, shapes} in send order."""
    return {"names": [n for n, _ in named],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in named],
            "shapes": [list(t.shape) for _, t in named]}


def tensor_nbytes(shape: list[int], dtype_name: str) -> int:
    return math.prod(shape) * torch.empty((), dtype=getattr(torch, dtype_name)).element_size()


def packed_chunks(nbytes: list[int], buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> list[list[int]]:
    """Tensor indices per broadcast: flush once the running total exceeds the buffer."""
    chunks, cur, total = [], [], 0
    for i, n in enumerate(nbytes):
        cur.append(i)
        total += n
        if total > buffer_bytes:
            chunks.append(cur)
            cur, total = [], 0
    if cur:
        chunks.append(cur)
    return chunks


def init_info(proto: NcclProtocol, world_size: int, *, unique_id: bytes | None = None,
              master_address: str | None = None, master_port: int | None = None,
              buffer_bytes: int = DEFAULT_BUFFER_BYTES, num_buffers: int = DEFAULT_NUM_BUFFERS) -> dict:
    """/init_weight_transfer_engine payload for this protocol variant."""
    info: dict = {"rank_offset": 1, "world_size": world_size}
    if unique_id is not None:
        if not proto.unique_id_b64:
            raise ValueError("this vLLM (< 0.30) does not accept nccl_unique_id_b64")
        info["nccl_unique_id_b64"] = base64.b64encode(unique_id).decode("ascii")
    else:
        info.update(master_address=master_address, master_port=master_port)
    if proto.packed_in_init:
        info.update(packed=True, packed_buffer_size_bytes=buffer_bytes, packed_num_buffers=num_buffers)
    return info


def update_info(proto: NcclProtocol, meta: dict[str, list], buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                num_buffers: int = DEFAULT_NUM_BUFFERS) -> dict:
    """/update_weights payload: the manifest, plus packing settings before 0.28."""
    info = dict(meta)
    if not proto.packed_in_init:
        info.update(packed=True, packed_buffer_size_bytes=buffer_bytes, packed_num_buffers=num_buffers)
    return info


def pack_chunk(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One broadcast buffer: the tensors' bytes back to back."""
    return torch.cat([t.contiguous().view(torch.uint8).reshape(-1) for t in tensors])


class NcclTransport:
    """Rank-0 NCCL sender, one communicator per server (needs vLLM >= 0.30 and a GPU)."""

    name = "nccl"

    def __init__(self, buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> None:
        self.buffer_bytes = buffer_bytes
        self._comms: dict[str, tuple[object, NcclProtocol]] = {}

    async def init(self, admin: VLLMAdmin) -> None:
        proto = NcclProtocol.for_version(await admin.server_version())
        if not proto.unique_id_b64:
            raise RuntimeError("nccl transport needs vLLM >= 0.30 (nccl_unique_id_b64 rendezvous)")
        workers = int((await admin.call("init", "GET", "/get_world_size"))["world_size"])
        world = workers + 1
        uid = torch.cuda.nccl.unique_id()
        post = asyncio.create_task(admin.init_engine(init_info(proto, world, unique_id=uid,
                                                               buffer_bytes=self.buffer_bytes)))
        comm = await asyncio.to_thread(_init_rank0, world, uid)
        await post
        self._comms[admin.url] = (comm, proto)

    async def send(self, admin: VLLMAdmin, prepared: Prepared) -> None:
        comm, proto = self._comms[admin.url]
        named = prepared.extra["named"]
        meta = manifest(named)
        post = asyncio.create_task(admin.update(update_info(proto, meta, self.buffer_bytes)))
        sizes = [t.numel() * t.element_size() for _, t in named]
        for idx in packed_chunks(sizes, self.buffer_bytes):
            buf = pack_chunk([named[i][1] for i in idx])
            await asyncio.to_thread(torch.cuda.nccl.broadcast, [buf], 0, None, [comm])
        await post

    def prepare(self, named: list[tuple[str, torch.Tensor]], version: int) -> Prepared:
        nbytes = sum(t.numel() * t.element_size() for _, t in named)
        return Prepared(version, [], nbytes=nbytes, extra={"named": named})

    def close(self) -> None:
        self._comms.clear()


def _init_rank0(world: int, uid: bytes):
    """ncclCommInitRank as rank 0, then the 1-element all_reduce warm-up vLLM expects."""
    comm = torch.cuda.nccl.init_rank(world, uid, 0)
    warm = torch.ones(1, device="cuda", dtype=torch.float32)
    torch.cuda.nccl.all_reduce([warm], comms=[comm])
    torch.cuda.synchronize()
    return comm
