"""The trainer's own NCCL binding and its vLLM-free pre-0.30 rendezvous, on real GPUs.

A child process on GPU 1 plays the vLLM worker exactly as vLLM 0.26 does it: TCPStore
client, unpickle "broadcast_from/0/0" as vllm's ctypes ncclUniqueId (a stand-in class
under that module path), ncclCommInitRank, 1-element float32 all_reduce, then packed
uint8 broadcasts. (Against real vLLM: benchmarks/gpu_weight_sync.py, docs/gpu.md.)
"""
from __future__ import annotations

import pytest

nccl = pytest.importorskip("agrpo.services.trainer.weight_sync.nccl")
pytestmark = pytest.mark.skipif(not hasattr(nccl, "NcclLib"), reason="trainer lacks the NcclLib patch")


def _tensors(seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(torch.bfloat16) for s in ((64, 32), (7,), (3, 5, 11))]


def _worker(port: int, nbytes: int, q) -> None:
    import ctypes
    import pickle
    import sys
    import types
    from datetime import timedelta

    import torch
    from torch.distributed import TCPStore

    from agrpo.services.trainer.weight_sync import nccl as n

    mod = "vllm.distributed.device_communicators.pynccl_wrapper"
    parts = mod.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))

    class ncclUniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_byte * 128)]
    ncclUniqueId.__module__ = mod
    sys.modules[mod].ncclUniqueId = ncclUniqueId
    try:
        torch.cuda.set_device(1)
        store = TCPStore("127.0.0.1", port, world_size=2, is_master=False, timeout=timedelta(seconds=60),
                         use_libuv=False)
        uid = pickle.loads(store.get("broadcast_from/0/0"))
        lib = n.nccl_lib()
        comm = lib.init_rank(2, bytes(uid), 1)
        stream = torch.cuda.current_stream()
        warm = torch.zeros(1, device="cuda")
        lib.all_reduce_sum(warm, comm, stream)
        buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        lib.broadcast(buf, comm, stream)
        stream.synchronize()
        want = n.pack_chunk(_tensors(0)).cuda()
        q.put(("ok", bool(torch.equal(buf, want)), type(uid).__name__))
    except Exception as exc:  # noqa: BLE001
        q.put(("error", repr(exc), ""))


def test_nccl_lib_single_rank():
    import torch

    lib = nccl.nccl_lib()
    uid = lib.unique_id()
    assert isinstance(uid, bytes) and len(uid) == 128 and any(uid)
    comm = lib.init_rank(1, uid, 0)
    t = torch.full((1,), 3.0, device="cuda")
    lib.all_reduce_sum(t, comm, torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert t.item() == 3.0


@pytest.mark.two_gpus
@pytest.mark.timeout(180)
def test_store_rendezvous_and_packed_broadcast_without_vllm():
    import torch
    import torch.multiprocessing as mp

    torch.cuda.set_device(0)
    port = nccl.free_port()
    chunk = nccl.pack_chunk([t.cuda() for t in _tensors(0)])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    child = ctx.Process(target=_worker, args=(port, chunk.numel(), q))
    child.start()
    try:
        comm = nccl._store_rank0("127.0.0.1", port, 2, nccl.NcclProtocol.for_version("0.26.0"), 60.0)
        comm.stream = torch.cuda.Stream()
        comm.stream.wait_stream(torch.cuda.current_stream())
        comm.broadcast(chunk)
        comm.stream.synchronize()
        status, same, cls = q.get(timeout=120)
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert status == "ok", same
    assert cls == "ncclUniqueId" and same
