"""Adapter-only LoRA sync (trainer/weight_sync/adapter_sync.py) against a stand-in server, and the
plugin's staging of adapters in the server's own folder (vllm_plugin/agrpo_vllm_plugin/adapters.py)."""

from __future__ import annotations

import json
import logging

import pytest
from aiohttp import web

from agrpo.services.common.preflight import StartupError
from agrpo.services.trainer.weight_sync import WeightSyncer
from agrpo.services.trainer.weight_sync.adapter_sync import AdapterPlan, AdapterSync
from agrpo.services.trainer.weight_sync.base import Prepared, WeightTransport

LORA = {"enabled": True, "runtime_updating": True, "max_lora_rank": 16, "max_loras": 4, "max_cpu_loras": 4,
        "data_parallel_size": 1}


class Transport(WeightTransport):
    name = "http"
    carries_adapters = True

    @classmethod
    def from_config(cls, cfg, device):
        return cls()

    def prepare(self, named, version: int) -> Prepared:
        return Prepared(version, [{"safetensors_b64": "AA=="}], nbytes=10)

    async def send(self, admin, prepared: Prepared) -> None:
        await admin.update(prepared.update_infos[0])


class LoraServer:
    """Answers what adapter sync asks: the extension's lora info and staging, load and unload,
    /v1/models; anything else (vLLM's weight-update flow) is recorded and accepted."""

    def __init__(self, info: dict) -> None:
        self.info, self.calls, self.loaded, self.label = info, [], [], "default"
        self.url, self.runner = "", None

    async def handle(self, request: web.Request) -> web.Response:
        name = request.path.strip("/")
        body = await request.json() if request.can_read_body else {}
        name = body["method"] if name == "collective_rpc" else name
        self.calls.append(name)
        if name == "agrpo_lora_info":
            return web.json_response({"results": [self.info]})
        if name == "agrpo_stage_adapter":
            return web.json_response({"results": [{"path": f"/srv/{body['args'][0]}", "stage_s": 0.0}]})
        if name == "v1/load_lora_adapter":
            self.loaded.append(body["lora_name"])
        if name == "v1/unload_lora_adapter":
            self.loaded.remove(body["lora_name"])
        if name == "v1/models":
            return web.json_response({"data": [{"id": "base", "max_model_len": 64}, *({"id": n} for n in self.loaded)]})
        if name == "version":
            return web.json_response({"version": "0.32.0"})
        if name == "weight_info":
            return web.json_response({"weight_version": self.label})
        if name.startswith("agrpo_"):
            return web.json_response({"error": f"method {name} not found"}, status=500)
        return web.json_response({"status": "ok"})

    async def __aenter__(self) -> LoraServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


def _syncer(url: str, rank: int = 16, slots: int = 3, blocker: str | None = None, mode: str = "auto") -> WeightSyncer:
    plan = AdapterPlan(json.dumps({"r": rank, "lora_alpha": 32}), rank, slots, blocker)
    return WeightSyncer([url], Transport(), 5.0, 30.0, adapters=AdapterSync(plan, Transport(), mode=mode))


def _prepare(version: int):
    return lambda: Transport().prepare([], version)


async def test_each_version_is_a_new_adapter_and_the_oldest_is_unregistered():
    async with LoraServer(LORA) as server:
        syncer = _syncer(server.url)
        await syncer.open()
        for version in (1, 2, 3, 4):
            assert (await syncer.sync(version, _prepare(version))).ok
        assert syncer.payload == "adapter"
        assert server.loaded == ["agrpo-v2", "agrpo-v3", "agrpo-v4"]  # 3 slots: v1 left when v4 came
        assert not {"pause", "start_weight_update", "finish_weight_update"} & set(server.calls)  # no pause
        assert server.label == "default"  # the base weights were never written
        assert await syncer.stale_servers(4) == {}
        server.loaded.clear()  # a restarted server has no adapters
        assert await syncer.stale_servers(4) == {server.url: "lists no adapter agrpo-v4"}
        await syncer.close()


async def test_a_server_without_runtime_lora_gets_the_merged_layers(caplog):
    async with LoraServer({"enabled": False}) as server:
        syncer = _syncer(server.url)
        await syncer.open()
        with caplog.at_level(logging.WARNING):
            assert (await syncer.sync(1, _prepare(1))).ok
        assert syncer.payload == "full" and "update_weights" in server.calls and not server.loaded
        assert "--enable-lora" in caplog.text
        await syncer.close()


async def test_an_adapter_vllm_cannot_express_is_synced_merged_without_asking():
    async with LoraServer(LORA) as server:
        syncer = _syncer(server.url, blocker="peft.bias=all")
        await syncer.open()
        await syncer.sync(1, _prepare(1))
        assert syncer.payload == "full" and "agrpo_lora_info" not in server.calls
        await syncer.close()


async def test_lora_sync_merged_sends_the_merged_layers_to_a_server_that_takes_adapters(caplog):
    async with LoraServer(LORA) as server:
        syncer = _syncer(server.url, mode="merged")
        await syncer.open()
        with caplog.at_level(logging.INFO):
            assert (await syncer.sync(1, _prepare(1))).ok
        assert syncer.payload == "full" and "update_weights" in server.calls and not server.loaded
        assert "agrpo_lora_info" not in server.calls and "trainer.lora_sync merged" in caplog.text
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # asked for: no warning
        await syncer.close()


@pytest.mark.parametrize("info, blocker, why", [({"enabled": False}, None, "--enable-lora"),
                                                (LORA, "peft.bias=all", "peft.bias=all")])
async def test_lora_sync_adapter_makes_the_fallback_a_one_line_error(info, blocker, why):
    async with LoraServer(info) as server:
        syncer = _syncer(server.url, blocker=blocker, mode="adapter")
        await syncer.open()
        with pytest.raises(StartupError, match=f"trainer.lora_sync=adapter, but .*{why}") as err:
            await syncer.sync(1, _prepare(1))
        assert "\n" not in str(err.value) and "update_weights" not in server.calls
        await syncer.close()


@pytest.mark.parametrize("rank, slots, flag", [(32, 3, "--max-lora-rank 32"), (16, 6, "--max-loras 6")])
async def test_limits_a_server_cannot_meet_are_one_line_naming_the_flag(rank, slots, flag):
    async with LoraServer(LORA) as server:
        syncer = _syncer(server.url, rank=rank, slots=slots)
        await syncer.open()
        with pytest.raises(StartupError, match=flag):
            await syncer.sync(1, _prepare(1))
        await syncer.close()


def test_the_plugin_stages_adapters_in_its_own_folder_and_keeps_the_newest(tmp_path, monkeypatch):
    import base64

    import torch
    from safetensors.torch import load_file, save

    from agrpo_vllm_plugin.adapters import stage, transport_tensors

    monkeypatch.setenv("AGRPO_LORA_DIR", str(tmp_path))
    tensors = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(2, 4)}
    infos = [{"safetensors_b64": base64.b64encode(save(tensors)).decode()}]
    for version in range(1, 6):
        path = stage(f"agrpo-v{version}", json.dumps({"r": 2}), lambda: transport_tensors(infos), 3)
        again = stage(f"agrpo-v{version}", json.dumps({"r": 2}), lambda: pytest.fail("written twice"), 3)
        assert again == path  # every worker calls it; the first wrote it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agrpo-v2", "agrpo-v3", "agrpo-v4", "agrpo-v5"]
    loaded = load_file(str(tmp_path / "agrpo-v5" / "adapter_model.safetensors"))
    assert torch.equal(next(iter(loaded.values())), torch.ones(2, 4))
    assert json.loads((tmp_path / "agrpo-v5" / "adapter_config.json").read_text()) == {"r": 2}


def test_the_worker_stages_an_adapter_from_the_trainers_ipc_buffer(tmp_path, monkeypatch):
    """One GPU: the adapter travels in the trainer's CUDA IPC buffer (weight_sync/ipc.py) and the
    worker copies it out before answering (the trainer reuses the buffer)."""
    from types import SimpleNamespace

    import torch
    from safetensors.torch import load_file

    from agrpo.services.trainer.weight_sync import ipc
    from agrpo.services.trainer.weight_sync.transports import manifest
    from agrpo_vllm_plugin.worker import AgrpoWorkerExtension

    monkeypatch.setenv("AGRPO_LORA_DIR", str(tmp_path))
    named = [("base_model.model.model.layers.0.mlp.up_proj.lora_A.weight", torch.randn(4, 8)),
             ("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight", torch.randn(16, 4).bfloat16())]
    offsets, total = ipc.byte_offsets([t.numel() * t.element_size() for _, t in named])
    buffer = torch.zeros(total, dtype=torch.uint8)
    ipc.pack_into(buffer, named, offsets)
    monkeypatch.setattr("torch.multiprocessing.reductions.rebuild_cuda_tensor", lambda *a: buffer)
    share = ipc.share_fields((None, torch.Size([total]), None, 0, None, None, 0, b"h", total, 0, False, b"c", 0,
                              None, False), "GPU-a")
    info = {"buffer": share, **manifest(named), "offsets": offsets}
    worker = AgrpoWorkerExtension()
    worker.device = SimpleNamespace(type="cuda", index=0)
    worker.vllm_config = SimpleNamespace(model_config=SimpleNamespace(quantization=None))
    answer = worker.agrpo_stage_adapter("agrpo-v7", json.dumps({"r": 4}), json.dumps([info]), "3")
    buffer.zero_()  # the trainer packs the next version
    staged = load_file(str(tmp_path / "agrpo-v7" / "adapter_model.safetensors"))
    assert answer["path"] == str(tmp_path / "agrpo-v7")
    for name, want in named:
        assert staged[name].dtype == want.dtype and torch.equal(staged[name], want)


class Nccl(Transport):
    name = "nccl"
    carries_adapters = False  # its payload is a broadcast the worker extension does not stage


async def test_with_nccl_the_adapter_travels_inline_in_the_stage_request():
    """Trainer and vLLM on different GPUs (NCCL for full weights): the adapter still goes alone,
    as base64 safetensors the worker extension stages (agrpo_vllm_plugin.adapters), not merged."""
    import torch

    from agrpo_vllm_plugin.adapters import transport_tensors

    plan = AdapterPlan(json.dumps({"r": 16}), 16, 3)
    async with LoraServer(LORA) as srv:
        syncer = WeightSyncer([srv.url], Nccl(), 5.0, 30.0, adapters=AdapterSync(plan, Nccl()))
        await syncer.open()
        try:
            assert syncer.payload_transport is syncer.transport  # undecided: full weights
            report = await syncer.sync(1, _prepare(1))
            assert report.ok and syncer.payload == "adapter"
            named = [("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", torch.randn(16, 8))]
            prepared = syncer.payload_transport.prepare(named, 2)
            staged = transport_tensors(json.loads(json.dumps(prepared.update_infos)))
            assert torch.equal(staged[named[0][0]], named[0][1])
        finally:
            await syncer.close()
