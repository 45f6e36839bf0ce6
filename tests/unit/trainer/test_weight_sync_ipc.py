"""The CUDA IPC weight transport's wire format and its place in the sync, on CPU.

The trainer side (services/trainer/weight_sync/ipc.py) and the vLLM worker side
(vllm_plugin/agrpo_vllm_plugin/ipc.py) are written separately, as the two ends of a protocol;
these tests pack with one and read with the other. Opening a real CUDA IPC handle needs a GPU
(tests/gpu/test_gpu_ipc.py); the load into vLLM runs in scripts/gpu/run_sync_bench.sh.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_trainer_orchestrator import FakeVLLM

from agrpo.services.trainer.weight_sync import WeightSyncer, ipc
from agrpo.services.trainer.weight_sync.nccl import NcclTransport, manifest
from agrpo.services.trainer.weight_sync.transports import Prepared
from agrpo_vllm_plugin.ipc import OpenBuffer, rebuild_args, views

NAMED = [("embed.weight", torch.randn(5, 3, dtype=torch.bfloat16)),
         ("norm.weight", torch.randn(7)),
         ("lm_head.bias", torch.randn(3, dtype=torch.float16)),
         ("scale", torch.tensor(2.5))]


def test_offsets_are_aligned_and_do_not_overlap():
    offsets, total = ipc.byte_offsets([30, 1, 256, 0, 5])
    assert offsets == [0, 256, 512, 768, 768] and total == 773
    assert all(o % ipc.ALIGN == 0 for o in offsets)


def test_what_the_trainer_packs_the_worker_reads_back_exactly():
    sizes = [t.numel() * t.element_size() for _, t in NAMED]
    offsets, total = ipc.byte_offsets(sizes)
    buffer = torch.zeros(total, dtype=torch.uint8)
    ipc.pack_into(buffer, NAMED, offsets)
    info = json.loads(json.dumps({**manifest(NAMED), "offsets": offsets}))  # what travels
    out = views(buffer, info)
    assert [n for n, _ in out] == [n for n, _ in NAMED]
    for (_, want), (_, got) in zip(NAMED, out):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        assert got.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()  # a view, no copy


def test_share_fields_survive_json_into_rebuild_args():
    handle, counter, event = b"\x00\x01ipc-handle\xff", b"/torch_123_ref", b"\x07" * 64
    args = (torch.Tensor, torch.Size([4096]), (1,), 0, torch.storage.TypedStorage, torch.uint8, 0,
            handle, 8192, 1024, False, counter, 16, event, True)
    share = json.loads(json.dumps(ipc.share_fields(args, "GPU-abc")))
    assert share["uuid"] == "GPU-abc" and share["nbytes"] == 4096
    rebuilt = rebuild_args(share, device_index=3)
    assert rebuilt[1] == torch.Size([4096]) and rebuilt[5] is torch.uint8 and rebuilt[6] == 3
    assert rebuilt[7:] == (handle, 8192, 1024, False, counter, 16, event, True)
    assert rebuild_args({**share, "event_handle": None}, 0)[13] is None


def test_the_worker_keeps_one_buffer_open_per_handle(monkeypatch):
    opened = []

    def fake_rebuild(*args):
        opened.append(args[7])
        return torch.zeros(args[1][0], dtype=torch.uint8)
    monkeypatch.setattr("torch.multiprocessing.reductions.rebuild_cuda_tensor", fake_rebuild)
    share = ipc.share_fields((None, torch.Size([8]), None, 0, None, None, 0, b"h1", 8, 0, False, b"c", 0,
                              None, False), "GPU-a")
    held = OpenBuffer()
    first = held.get(share, 0)
    assert held.get(share, 0) is first and opened == [b"h1"]  # reused, not re-opened
    held.get({**share, "handle": ipc._b64(b"h2")}, 0)  # a restarted trainer shares a new buffer
    assert opened == [b"h1", b"h2"]


class _Worker(FakeVLLM):
    """Answers the IPC check as a worker on GPU `uuid` would."""

    def __init__(self, uuid: str, **kw) -> None:
        super().__init__(extension="ok", version="0.26.0", **kw)
        self.uuid = uuid

    def _extension(self, method: str):
        from aiohttp import web

        if method == ipc.IPC_CHECK:
            ok = self.uuid == "GPU-trainer"
            return web.json_response({"results": [{"ok": ok, "uuid": self.uuid,
                                                   "why": "" if ok else f"vLLM worker on GPU {self.uuid}"}]})
        return super()._extension(method)


def _prepared(version: int) -> Prepared:
    return Prepared(version, [{"buffer": {"handle": "x"}, "names": [], "dtype_names": [], "shapes": [],
                               "offsets": []}])


async def _sync(worker_gpu: str, transport, versions: list[int]) -> tuple[_Worker, list]:
    """Sync `versions` in turn into a stand-in worker on `worker_gpu`; the worker and the reports."""
    worker = await _Worker(worker_gpu).start()
    try:
        syncer = WeightSyncer([worker.url], transport, 5.0, 30.0)
        await syncer.open()
        reports = [await syncer.sync(v, lambda v=v: _prepared(v)) for v in versions]
        await syncer.close()
    finally:
        await worker.stop()
    return worker, reports


async def test_ipc_sync_is_a_direct_load_without_a_transfer_engine():
    worker, (first, second) = await _sync("GPU-trainer", ipc.IpcTransport(uuid="GPU-trainer"), [3, 4])
    assert first.ok and second.ok and worker.label == "4"
    # no /init_weight_transfer_engine, no direct-load probe of the NCCL engine
    assert worker.calls[:3] == [ipc.IPC_CHECK, "version", "weight_info"]
    assert worker.calls[3:] == ["sleep", ipc.IPC_LOAD, "reset_prefix_cache", "update_weight_version",
                                "resume"] * 2


async def test_ipc_refuses_a_server_on_another_gpu_in_one_line():
    worker, (report,) = await _sync("GPU-other", ipc.IpcTransport(uuid="GPU-trainer"), [1])
    err = report.errors[worker.url]
    assert err.phase == "init" and "weight_transport=ipc" in err.detail and "GPU-other" in err.detail
    assert ipc.IPC_LOAD not in worker.calls and "sleep" not in worker.calls  # never paused


async def test_nccl_names_the_ipc_transport_when_vllm_shares_the_gpu(monkeypatch):
    monkeypatch.setattr("agrpo.services.trainer.weight_sync.nccl.gpu_uuid", lambda device=None: "GPU-trainer")
    worker, (report,) = await _sync("GPU-trainer", NcclTransport(), [1])
    err = report.errors[worker.url]
    assert err.phase == "init" and "trainer.weight_transport: ipc" in err.detail
    assert "init_weight_transfer_engine" not in worker.calls


def test_config_refuses_ipc_with_vllms_load_flow():
    from agrpo.services.common.config import AgrpoConfig

    with pytest.raises(ValueError, match="weight_load must be auto or direct"):
        AgrpoConfig.model_validate({"trainer": {"weight_transport": "ipc", "weight_load": "vllm"}})
    assert AgrpoConfig.model_validate({"trainer": {"weight_transport": "ipc"}}).trainer.weight_load == "auto"
