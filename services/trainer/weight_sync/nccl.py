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
  the trainer side needs only torch's own NCCL bindings (rendezvous "b64").
- Older servers rendezvous through a TCPStore that the trainer (rank 0) hosts: the
  workers read key "broadcast_from/0/0", a pickle of vLLM's ctypes `ncclUniqueId`.
  Rendezvous "vllm" imports vLLM lazily (only here) and uses its StatelessProcessGroup
  + PyNcclCommunicator; "store" needs no vLLM: it hosts the TCPStore itself and
  writes the same pickle bytes by hand (`unique_id_pickle`).
- Without vLLM, the NCCL calls go through `NcclLib`, a ctypes binding of torch's own
  libnccl.so.2 (torch.cuda.nccl.init_rank is broken on Python >= 3.10, see there).
  "auto" picks b64 on >= 0.30, else store: the trainer never needs vLLM.
Every blocking step (rendezvous, broadcast + stream sync, the server's HTTP call) has
a timeout and fails as a WeightSyncError naming the phase, never as a silent hang.
Pure functions (metadata, chunk plan, payloads) are unit-tested on CPU; the senders
were run against real vLLM 0.26 on 2x H200 (docs/gpu.md).
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch

from agrpo.services.common.logging import get_logger
from agrpo.services.common.ports import free_port
from agrpo.services.common.vllm_api import parse_vllm_version as parse_version

from .base import Prepared, WeightTransport
from .client import IPC_CHECK, VLLMAdmin, WeightSyncError
from .transports import gpu_uuid, manifest

DEFAULT_BUFFER_BYTES = 1 << 30  # trainer.nccl_buffer_mb's default (1024 MiB)
DEFAULT_NUM_BUFFERS = 2
DEFAULT_TIMEOUT_S = 120.0  # trainer.nccl_timeout_s's default
VLLM_UNIQUE_ID_CLASS = ("vllm.distributed.device_communicators.pynccl_wrapper", "ncclUniqueId")

log = get_logger("trainer.weight_sync.nccl")


@dataclass(frozen=True)
class NcclProtocol:
    """Which variant of vLLM's NCCL weight-transfer protocol a server speaks."""

    packed_in_init: bool   # >= 0.28
    unique_id_b64: bool    # >= 0.30

    @classmethod
    def for_version(cls, version: str) -> NcclProtocol:
        v = parse_version(version)
        return cls(packed_in_init=v >= (0, 28, 0), unique_id_b64=v >= (0, 30, 0))


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
    info: dict[str, Any] = dict(meta)
    if not proto.packed_in_init:
        info.update(packed=True, packed_buffer_size_bytes=buffer_bytes, packed_num_buffers=num_buffers)
    return info


def pack_chunk(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One broadcast buffer: the tensors' bytes back to back."""
    return torch.cat([t.contiguous().view(torch.uint8).reshape(-1) for t in tensors])


def unique_id_pickle(uid: bytes, cls: tuple[str, str] = VLLM_UNIQUE_ID_CLASS) -> bytes:
    """Pickle bytes that load as vLLM's ctypes `ncclUniqueId` holding `uid`.

    ctypes pickles a Structure as `_ctypes._unpickle(cls, (__dict__, raw bytes))`; we
    write those opcodes directly (protocol 3) so the trainer never imports vLLM.
    """
    if len(uid) != 128:
        raise ValueError(f"ncclUniqueId is 128 bytes, got {len(uid)}")
    module, name = cls
    return (b"\x80\x03" + b"c_ctypes\n_unpickle\n" + f"c{module}\n{name}\n".encode()
            + b"}" + b"C\x80" + uid + b"\x86\x86R.")


def local_address_for(url: str) -> str:
    """This host's address on the route to the server (no packet is sent)."""
    host = urlparse(url).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


class NcclLib:
    """A minimal ctypes binding of the libnccl.so.2 that torch already loaded.

    torch.cuda.nccl.init_rank cannot be called on Python >= 3.10 (its C argument
    parsing lacks PY_SSIZE_T_CLEAN: "SystemError: PY_SSIZE_T_CLEAN macro must be
    defined for '#' formats", seen with torch 2.11 / Python 3.12 on H200s), so we bind
    the five NCCL calls we need ourselves. No vLLM import.
    """

    UINT8, FLOAT32, SUM = 1, 7, 0

    def __init__(self) -> None:
        import ctypes

        torch.cuda.init()  # loads torch_cuda and, with it, libnccl.so.2
        try:
            lib = ctypes.CDLL("libnccl.so.2")  # the already-loaded library (matched by soname)
        except OSError:
            import nvidia.nccl  # the pip package torch depends on

            lib = ctypes.CDLL(f"{next(iter(nvidia.nccl.__path__))}/lib/libnccl.so.2")
        self.ct, self.lib = ctypes, lib

        class UniqueId(ctypes.Structure):
            _fields_ = [("internal", ctypes.c_byte * 128)]
        self.UniqueId = UniqueId
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(UniqueId)]
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(vp), i, UniqueId, i]
        lib.ncclAllReduce.argtypes = [vp, vp, sz, i, i, vp, vp]
        lib.ncclBroadcast.argtypes = [vp, vp, sz, i, i, vp, vp]
        lib.ncclCommAbort.argtypes = [vp]

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed: NCCL error {rc}: {self.lib.ncclGetErrorString(rc).decode()}")

    def unique_id(self) -> bytes:
        uid = self.UniqueId()
        self._check(self.lib.ncclGetUniqueId(self.ct.byref(uid)), "ncclGetUniqueId")
        return bytes(uid)

    def init_rank(self, world: int, uid: bytes, rank: int):
        comm, u = self.ct.c_void_p(), self.UniqueId()
        self.ct.memmove(self.ct.addressof(u), uid, 128)
        self._check(self.lib.ncclCommInitRank(self.ct.byref(comm), world, u, rank), "ncclCommInitRank")
        return comm

    def all_reduce_sum(self, t: torch.Tensor, comm, stream) -> None:
        self._check(self.lib.ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), self.FLOAT32, self.SUM,
                                           comm, stream.cuda_stream), "ncclAllReduce")

    def broadcast(self, buf: torch.Tensor, comm, stream) -> None:
        self._check(self.lib.ncclBroadcast(buf.data_ptr(), buf.data_ptr(), buf.numel(), self.UINT8, 0,
                                           comm, stream.cuda_stream), "ncclBroadcast")

    def abort(self, comm) -> None:
        self.lib.ncclCommAbort(comm)


_LIB: NcclLib | None = None


def nccl_lib() -> NcclLib:
    global _LIB
    if _LIB is None:
        _LIB = NcclLib()
    return _LIB


@dataclass
class _Comm:
    """One rank-0 communicator: our ctypes binding ("nccl") or vLLM's PyNccl ("pynccl")."""

    kind: str
    handle: Any                    # a ctypes comm ("nccl") or vLLM's PyNcclCommunicator ("pynccl")
    proto: NcclProtocol
    stream: Any = None             # torch.cuda.Stream, dedicated: a stuck peer never blocks training
    keep: list = field(default_factory=list)  # the TCPStore must outlive the rendezvous

    def broadcast(self, buf: torch.Tensor) -> None:
        if self.kind == "nccl":
            nccl_lib().broadcast(buf, self.handle, self.stream)
        else:
            self.handle.broadcast(buf, src=0, stream=self.stream)

    def abort(self) -> None:
        """Free a communicator stuck in a collective (its kernels then end with an error)."""
        try:
            if self.kind == "nccl":
                nccl_lib().abort(self.handle)
            else:
                self.handle.destroy()
        except Exception as exc:  # noqa: BLE001  (best effort on an already failed path)
            log.warning("nccl abort failed: %s", exc)


class NcclTransport(WeightTransport):
    """Rank-0 NCCL sender, one communicator per server (needs a GPU separate from vLLM's)."""

    name = "nccl"
    snapshot = False  # sends the live parameters: the next step must wait for the push
    needs_gpu = True

    @classmethod
    def from_config(cls, cfg, device: torch.device) -> NcclTransport:
        t = cfg.trainer
        return cls(buffer_bytes=t.nccl_buffer_mb * 1024 * 1024, rendezvous=t.nccl_rendezvous,
                   timeout=t.nccl_timeout_s, master_address=t.nccl_master_address)

    def __init__(self, buffer_bytes: int = DEFAULT_BUFFER_BYTES, rendezvous: str = "auto",
                 timeout: float = DEFAULT_TIMEOUT_S, master_address: str | None = None) -> None:
        if rendezvous not in ("auto", "b64", "vllm", "store"):
            raise ValueError(f"unknown rendezvous {rendezvous!r}")
        self.buffer_bytes, self.rendezvous, self.timeout = buffer_bytes, rendezvous, timeout
        self.master_address = master_address
        self._comms: dict[str, _Comm] = {}
        self.last: dict[str, float] = {}  # pack_s, broadcast_s, server_s of the last send

    def _choose(self, proto: NcclProtocol) -> str:
        if self.rendezvous == "b64" and not proto.unique_id_b64:
            raise ValueError("this vLLM (< 0.30) does not accept nccl_unique_id_b64")
        if self.rendezvous != "auto":
            return self.rendezvous
        # Torch only on both protocols: no vLLM import (seconds), and on 2x H200 the store
        # path was bit-exact and as fast as vLLM's own objects (docs/gpu.md).
        return "b64" if proto.unique_id_b64 else "store"

    async def init(self, admin: VLLMAdmin) -> None:
        await self._refuse_shared_gpu(admin)
        proto = NcclProtocol.for_version(await admin.server_version())
        way = self._choose(proto)
        world = int((await admin.call("init", "GET", "/get_world_size"))["world_size"]) + 1
        if way == "b64":
            uid = nccl_lib().unique_id()
            info = init_info(proto, world, unique_id=uid, buffer_bytes=self.buffer_bytes)
            local = lambda: _Comm("nccl", _init_rank0(world, uid), proto)  # noqa: E731
        else:
            addr = self.master_address or local_address_for(admin.url)
            port = free_port("")  # every interface: vLLM may dial from another host
            info = init_info(proto, world, master_address=addr, master_port=port,
                             buffer_bytes=self.buffer_bytes)
            local = (lambda: _vllm_rank0(addr, port, world, proto)) if way == "vllm" else \
                (lambda: _store_rank0(addr, port, world, proto, self.timeout))
        comm = await self._together(admin, "init", admin.init_engine(info), _on_device(local))
        comm.stream = torch.cuda.Stream()
        self._comms[admin.url] = comm
        log.info("nccl rendezvous with %s: %s (%s, world %d)", admin.url, way, comm.kind, world)

    @staticmethod
    async def _refuse_shared_gpu(admin: VLLMAdmin) -> None:
        """One line instead of an NCCL failure when vLLM runs on the trainer's GPU (asked of
        our worker extension; a server without it is not checked)."""
        mine = gpu_uuid()
        try:
            results = await admin.rpc("init", IPC_CHECK, mine)
        except WeightSyncError:
            return
        if any(isinstance(r, dict) and r.get("uuid") == mine for r in results):
            raise WeightSyncError("init", admin.url, "vLLM runs on the trainer's GPU, and NCCL needs one GPU "
                                  "per rank: set trainer.weight_transport: ipc (CUDA IPC, one GPU)")

    async def _together(self, admin: VLLMAdmin, phase: str, remote, local):
        """Run the server's HTTP call and a blocking local step at once; first error wins."""
        post = asyncio.ensure_future(remote)
        work = asyncio.ensure_future(asyncio.to_thread(local))
        done, pending = await asyncio.wait({post, work}, timeout=self.timeout,
                                           return_when=asyncio.FIRST_EXCEPTION)
        for task in pending:
            task.cancel()
        if pending and not any(t.exception() for t in done):
            raise WeightSyncError(phase, admin.url, f"nccl {phase} did not finish in {self.timeout:.0f} s"
                                  f" ({'server' if post in pending else 'local'} side still waiting)")
        for task in (post, work):
            if task.done() and task.exception() is not None:
                exc = task.exception()
                if isinstance(exc, WeightSyncError):
                    raise exc
                raise WeightSyncError(phase, admin.url, f"{type(exc).__name__}: {exc}") from exc
        return work.result()

    async def send(self, admin: VLLMAdmin, prepared: Prepared) -> None:
        comm = self._comms[admin.url]
        named = prepared.extra["named"]
        sizes = [t.numel() * t.element_size() for _, t in named]
        plan = packed_chunks(sizes, self.buffer_bytes)
        t0 = time.perf_counter()
        timing: dict[str, float] = {}

        def broadcast_all() -> None:
            comm.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(comm.stream):
                for idx in plan:
                    buf = pack_chunk([named[i][1] for i in idx])
                    comm.broadcast(buf)
                    buf.record_stream(comm.stream)
            timing["enqueued_s"] = time.perf_counter() - t0
            comm.stream.synchronize()
            timing["broadcast_s"] = time.perf_counter() - t0

        try:
            await self._together(admin, "update", self._update(admin, proto_info(comm, named, self.buffer_bytes),
                                                                   timing, t0), _on_device(broadcast_all))
        except WeightSyncError:
            self._comms.pop(admin.url, None)  # a half-done collective poisons the communicator
            comm.abort()
            raise
        self.last = {"chunks": len(plan), **timing}

    @staticmethod
    async def _update(admin: VLLMAdmin, info: dict, timing: dict, t0: float) -> None:
        await admin.update(info)
        timing["server_s"] = time.perf_counter() - t0

    def prepare(self, named: list[tuple[str, torch.Tensor]], version: int) -> Prepared:
        nbytes = sum(t.numel() * t.element_size() for _, t in named)
        return Prepared(version, [], nbytes=nbytes, extra={"named": named})

    def close(self) -> None:
        self._comms.clear()


def _on_device(fn):
    """Run `fn` in a worker thread on the caller's current CUDA device (it is per thread)."""
    dev = torch.cuda.current_device()

    def run():
        with torch.cuda.device(dev):
            return fn()
    return run


def proto_info(comm: _Comm, named: list[tuple[str, torch.Tensor]], buffer_bytes: int) -> dict:
    return update_info(comm.proto, manifest(named), buffer_bytes)


def _init_rank0(world: int, uid: bytes):
    """ncclCommInitRank as rank 0, then the 1-element float32 all_reduce warm-up vLLM expects."""
    lib = nccl_lib()
    comm = lib.init_rank(world, uid, 0)
    warm = torch.zeros(1, device="cuda", dtype=torch.float32)
    stream = torch.cuda.current_stream()
    lib.all_reduce_sum(warm, comm, stream)
    stream.synchronize()
    return comm


def _store_rank0(addr: str, port: int, world: int, proto: NcclProtocol, timeout: float) -> _Comm:
    """Torch-only pre-0.30 rendezvous: host the TCPStore, publish the pickled unique id."""
    from torch.distributed import TCPStore

    kw = dict(world_size=world, is_master=True, timeout=timedelta(seconds=timeout), wait_for_workers=False)
    try:
        store = TCPStore(addr, port, use_libuv=False, **kw)
    except (TypeError, RuntimeError):
        store = TCPStore(addr, port, **kw)
    uid = nccl_lib().unique_id()
    store.set("broadcast_from/0/0", unique_id_pickle(uid))
    return _Comm("nccl", _init_rank0(world, uid), proto, keep=[store])


def _vllm_rank0(addr: str, port: int, world: int, proto: NcclProtocol) -> _Comm:
    """Pre-0.30 rendezvous through vLLM's own helper (imports vLLM: only on this path)."""
    from vllm.distributed.weight_transfer import nccl_common

    info = {"master_address": addr, "master_port": port, "world_size": world}
    kwargs = {"rank": 0} if "rank" in inspect.signature(nccl_common.trainer_init).parameters else {}
    return _Comm("pynccl", nccl_common.trainer_init(info, **kwargs), proto)
