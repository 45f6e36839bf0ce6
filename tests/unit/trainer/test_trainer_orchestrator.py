"""Weight-sync orchestration rules against small aiohttp stand-ins of vLLM's RL routes.

Unit level only (one component, fake peers): the phase order, the label sent to
finish, partial failure across servers, the whole-sync timeout naming the phase, and
recovery from an update left active. The real-vLLM versions of these live in
tests/integration/trainer/.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from agrpo.services.trainer.weight_sync import WeightSyncer
from agrpo.services.trainer.weight_sync.base import Prepared, WeightTransport


class FakeVLLM:
    """`extension`: None (no worker extension: collective_rpc fails as in vLLM), "ok", or a
    refusal reason; `labels`: whether GET /weight_info exists (vLLM >= 0.30); `version`: what
    GET /version answers (below 0.26 vLLM's flow pauses with /pause)."""

    def __init__(self, hang_on: str | None = None, fail_on: str | None = None,
                 extension: str | None = None, labels: bool = True, version: str = "0.25.0",
                 swap: str | None = None) -> None:
        self.swap = swap  # agrpo_swap: None (no plugin in the engine), "ok", "fail" or a refusal
        self.swaps: list[dict] = []
        self.version = version
        self.calls: list[str] = []
        self.queries: dict[str, str] = {}
        self.bodies: dict[str, dict] = {}
        self.extension, self.labels = extension, labels
        self.label = "default"
        self.active = False
        self.hang_on, self.fail_on = hang_on, fail_on
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        name = request.path.strip("/")
        body = await request.json() if request.can_read_body else {}
        if name == "collective_rpc":
            name = body["method"]
        self.calls.append(name)
        self.queries[name], self.bodies[name] = request.query_string, body
        if name == self.hang_on:
            await self.release.wait()
        if name == self.fail_on:
            return web.json_response({"error": "boom"}, status=500)
        if name == "start_weight_update":
            if self.active:
                return web.json_response({"error": "start_weight_update called while a weight update "
                                                   "is already active."}, status=500)
            self.active = True
        if name == "finish_weight_update":
            self.active = False
            self.label = body.get("weight_version", self.label)
        if name == "version":
            return web.json_response({"version": self.version})
        if name == "weight_info":
            if not self.labels:
                return web.json_response({"detail": "Not Found"}, status=404)
            return web.json_response({"weight_version": self.label})
        if name == "update_weight_version":
            self.label = body["new_version"]
        if name == "agrpo_swap":
            return self._swap(json.loads(body["args"][0]))
        if name.startswith("agrpo_"):
            return self._extension(name)
        return web.json_response({"status": "ok"})

    def _swap(self, spec: dict) -> web.Response:
        """The engine-side swap as swap.py answers it (its own logic is unit-tested apart)."""
        if self.swap is None:
            return web.json_response({"error": "method agrpo_swap not found"}, status=500)
        works = self.swap in ("ok", "fail")
        if spec.get("probe") or not works:
            return web.json_response({"results": [{"ok": works, "why": "" if works else self.swap}]})
        self.swaps.append(spec)
        if self.swap == "fail":
            self.label = spec["failed_label"]
            return web.json_response({"error": "load failed"}, status=500)
        self.label = spec["label"]
        return web.json_response({"results": [{"ok": True, "drain_s": 0.001, "load_s": 0.002, "reset_s": 0.0}]})

    def _extension(self, method: str) -> web.Response:
        if self.extension is None:
            return web.json_response({"error": f"method {method} not found"}, status=500)
        if method == "agrpo_direct_load_check":
            return web.json_response({"results": [{"ok": self.extension == "ok", "why": self.extension}]})
        return web.json_response({"results": [{"load_s": 0.001, "tensors": 2}]})

    async def start(self) -> FakeVLLM:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def stop(self) -> None:
        self.release.set()
        await self.runner.cleanup()


class NoopTransport(WeightTransport):
    """The update phase as http sends it, with a payload the test builds."""

    name = "http"
    in_band = True

    @classmethod
    def from_config(cls, cfg, device):
        return cls()

    async def init(self, admin) -> None:
        await admin.init_engine({})

    def prepare(self, named, version):
        return _prepare(version)()

    async def send(self, admin, prepared) -> None:
        for info in prepared.update_infos:
            await admin.update(info)


def _prepare(version: int):
    return lambda: Prepared(version, [{"safetensors_b64": "x"}, {"safetensors_b64": "y"}], nbytes=2)


@pytest.fixture
async def servers():
    made: list[FakeVLLM] = []

    async def make(**kw) -> FakeVLLM:
        made.append(await FakeVLLM(**kw).start())
        return made[-1]
    yield make
    for s in made:
        await s.stop()


async def test_phase_order_and_label(servers):
    a = await servers()
    syncer = WeightSyncer([a.url], NoopTransport(), 5.0, 30.0)
    await syncer.open()
    report = await syncer.sync(3, _prepare(3))
    await syncer.close()
    assert report.ok and report.synced == [a.url]
    # auto: the server has no worker extension, so vLLM's own flow; /pause already clears the cache
    assert a.calls == ["init_weight_transfer_engine", "version", "agrpo_direct_load_check", "pause",
                       "start_weight_update", "update_weights", "update_weights", "finish_weight_update", "resume"]
    assert a.label == "3"


@pytest.mark.parametrize("reload, init_info", [("auto", {}), ("layerwise", {"reload": "layerwise"})])
async def test_cpu_transports_ask_for_the_reload_of_the_config(servers, tmp_path, reload, init_info):
    """trainer.cpu_reload reaches our plugin's cpu_http engine; the default is left unsaid, so a
    plugin from before the option accepts it."""
    from agrpo.services.trainer.weight_sync.transports import HttpTransport, SharedPathTransport

    for transport in (HttpTransport(reload=reload), SharedPathTransport(tmp_path, reload=reload)):
        a = await servers()
        syncer = WeightSyncer([a.url], transport, 5.0, 30.0)
        await syncer.open()
        report = await syncer.sync(1, _prepare(1))
        await syncer.close()
        assert report.ok and a.bodies["init_weight_transfer_engine"] == {"init_info": init_info}


async def test_vllm_flow_pauses_without_the_settle_sleep_from_0_26(servers):
    a = await servers(version="0.32.0")
    syncer = WeightSyncer([a.url], NoopTransport(), 5.0, 30.0)
    await syncer.open()
    report = await syncer.sync(3, _prepare(3))
    await syncer.close()
    assert report.ok and a.label == "3"
    # /sleep level 0 freezes scheduling (no 20 ms sleep as in /pause); the cache reset after the
    # update does what /pause's clear_cache did: running requests are recomputed under the new weights
    assert a.calls[3:] == ["sleep", "start_weight_update", "update_weights", "update_weights",
                           "finish_weight_update", "reset_prefix_cache", "resume"]
    assert a.queries["sleep"] == "level=0&mode=keep"
    assert a.queries["reset_prefix_cache"] == "reset_running_requests=true"


async def test_direct_load_when_the_extension_agrees(servers):
    a = await servers(extension="ok")
    syncer = WeightSyncer([a.url], NoopTransport(), 5.0, 30.0)
    await syncer.open()
    first = await syncer.sync(3, _prepare(3))
    second = await syncer.sync(4, _prepare(4))
    await syncer.close()
    assert first.ok and second.ok and a.label == "4"
    assert a.calls[:4] == ["init_weight_transfer_engine", "version", "agrpo_direct_load_check", "weight_info"]
    assert a.calls[4:] == ["sleep", "agrpo_load_weights", "agrpo_load_weights", "reset_prefix_cache",
                           "update_weight_version", "resume"] * 2
    assert a.queries["sleep"] == "level=0&mode=keep"  # frozen, nothing dropped yet
    assert a.queries["reset_prefix_cache"] == "reset_running_requests=true"  # as /pause's clear_cache
    assert "start_weight_update" not in a.calls and "update_weights" not in a.calls


async def test_a_held_server_is_synced_without_a_second_pause_and_released_once(servers):
    """The alternate schedule: hold pauses every server while the trainer computes; the step's sync
    then skips its own pause and its resume releases the server; with no sync, release resumes."""
    a = await servers(extension="ok")
    syncer = WeightSyncer([a.url], NoopTransport(), 5.0, 30.0)
    await syncer.open()
    await syncer.sync(3, _prepare(3))
    a.calls.clear()
    await syncer.hold()
    report = await syncer.sync(4, _prepare(4))
    await syncer.release()
    assert report.ok and "pause" not in report.phase_s
    assert a.calls == ["sleep", "agrpo_load_weights", "agrpo_load_weights", "reset_prefix_cache",
                       "update_weight_version", "resume"]
    a.calls.clear()
    await syncer.hold()
    await syncer.release()
    await syncer.release()  # nothing held any more
    await syncer.close()
    assert a.calls == ["sleep", "resume"] and a.queries["sleep"] == "level=0&mode=keep"


async def test_direct_load_without_labels_skips_the_label(servers):
    a = await servers(extension="ok", labels=False)
    syncer = WeightSyncer([a.url], NoopTransport(), 5.0, 30.0, load_mode="direct")
    await syncer.open()
    report = await syncer.sync(1, _prepare(1))
    await syncer.close()
    assert report.ok and "update_weight_version" not in a.calls and a.calls[-1] == "resume"


@pytest.mark.parametrize("extension", [None, "device cpu: CPU layers repack their weights"])
async def test_forced_direct_load_names_why_it_cannot(servers, extension):
    a = await servers(extension=extension)
    syncer = WeightSyncer([a.url], NoopTransport(), 5.0, 30.0, load_mode="direct")
    await syncer.open()
    report = await syncer.sync(1, _prepare(1))
    await syncer.close()
    err = report.errors[a.url]
    assert err.phase == "init" and "weight_load=direct" in err.detail
    assert ("worker-extension-cls" if extension is None else "repack") in err.detail
    assert "pause" not in a.calls and "sleep" not in a.calls


async def test_failed_direct_load_stays_paused_under_a_partial_label(servers):
    a = await servers(extension="ok", fail_on="agrpo_load_weights")
    syncer = WeightSyncer([a.url], NoopTransport(), 5.0, 30.0)
    await syncer.open()
    report = await syncer.sync(1, _prepare(1))
    await syncer.close()
    assert report.errors[a.url].phase == "update"
    assert a.label == "partial" and "resume" not in a.calls


def test_unknown_load_mode_is_refused():
    with pytest.raises(ValueError, match="weight load mode"):
        WeightSyncer([], NoopTransport(), 5.0, 30.0, load_mode="fast")


async def test_one_failing_server_does_not_block_the_others(servers):
    good, bad = await servers(), await servers(fail_on="pause")
    syncer = WeightSyncer([good.url, bad.url], NoopTransport(), 5.0, 30.0)
    await syncer.open()
    report = await syncer.sync(1, _prepare(1))
    assert report.synced == [good.url]
    assert report.errors[bad.url].phase == "pause" and "HTTP 500" in str(report.errors[bad.url])
    bad.fail_on = None
    assert await syncer.stale_servers(1) == {bad.url: "reports weight label 'default'"}
    again = await syncer.reconcile(1, _prepare(1))
    await syncer.close()
    assert again.synced == [bad.url] and bad.label == "1"
    assert bad.calls.count("init_weight_transfer_engine") == 2  # re-initialised after the failure


async def test_whole_sync_timeout_names_the_phase(servers):
    a = await servers(hang_on="update_weights")
    syncer = WeightSyncer([a.url], NoopTransport(), phase_timeout=30.0, total_timeout=0.5)
    await syncer.open()
    report = await asyncio.wait_for(syncer.sync(1, _prepare(1)), 10)
    await syncer.close()
    err = report.errors[a.url]
    assert err.phase == "update" and "weight_sync_timeout" in err.detail


async def test_failed_update_is_closed_and_retry_recovers(servers):
    a = await servers(fail_on="update_weights")
    syncer = WeightSyncer([a.url], NoopTransport(), 5.0, 30.0)
    await syncer.open()
    report = await syncer.sync(1, _prepare(1))
    assert report.errors[a.url].phase == "update"
    assert a.label == "partial" and "resume" not in a.calls  # closed, left paused
    a.fail_on = None
    a.active = True  # as if the best-effort close had not reached the server
    report = await syncer.reconcile(1, _prepare(1))
    await syncer.close()
    assert report.ok and a.label == "1"


async def test_swap_is_one_call_the_engine_runs(servers):
    a = await servers(version="0.32.0", swap="ok")
    syncer = WeightSyncer([a.url], NoopTransport(), 5.0, 30.0, swap=True)
    await syncer.open()
    first = await syncer.sync(3, _prepare(3))
    second = await syncer.sync(4, _prepare(4))
    await syncer.close()
    assert first.ok and second.ok and a.label == "4"
    assert a.calls[3:] == ["agrpo_swap", "agrpo_swap", "agrpo_swap"]  # the probe, then one call per sync
    spec = a.swaps[-1]
    assert [c["method"] for c in spec["calls"]] == ["start_weight_update", "update_weights", "update_weights",
                                                    "finish_weight_update"]
    assert [c["kwargs"]["update_info"] for c in spec["calls"][1:3]] == [{"safetensors_b64": "x"},
                                                                         {"safetensors_b64": "y"}]
    assert spec["on_failure"] == [{"method": "finish_weight_update"}] and spec["failed_label"] == "partial"
    assert spec["reset_prefix_cache"] is True and spec["reset_running"] is True
    assert {"update", "drain", "load", "reset_prefix_cache"} <= set(second.phase_s) and "pause" not in second.phase_s


async def test_swap_keeping_requests_leaves_the_cache_to_the_salt(servers):
    a = await servers(version="0.32.0", swap="ok")
    syncer = WeightSyncer([a.url], NoopTransport(), 5.0, 30.0, swap=True, recompute_in_flight=False)
    await syncer.open()
    assert (await syncer.sync(1, _prepare(1))).ok
    await syncer.close()
    assert a.swaps[0]["reset_prefix_cache"] is False and a.swaps[0]["reset_running"] is False


@pytest.mark.parametrize("swap", [None, "data_parallel_size=2: engines pause together"])
async def test_without_the_engine_swap_each_phase_is_a_call(servers, swap):
    a = await servers(version="0.32.0", swap=swap)
    syncer = WeightSyncer([a.url], NoopTransport(), 5.0, 30.0, swap=True)
    await syncer.open()
    report = await syncer.sync(2, _prepare(2))
    await syncer.close()
    assert report.ok and a.label == "2" and not a.swaps
    assert a.calls[-7:] == ["sleep", "start_weight_update", "update_weights", "update_weights",
                            "finish_weight_update", "reset_prefix_cache", "resume"]


async def test_failed_swap_is_an_update_error_and_the_next_sync_asks_again(servers):
    a = await servers(version="0.32.0", swap="fail")
    syncer = WeightSyncer([a.url], NoopTransport(), 5.0, 30.0, swap=True)
    await syncer.open()
    report = await syncer.sync(1, _prepare(1))
    err = report.errors[a.url]
    assert err.phase == "update" and a.label == "partial"
    assert "finish_weight_update" not in a.calls  # the engine closed the update itself
    a.swap = "ok"
    report = await syncer.sync(1, _prepare(1))
    await syncer.close()
    assert report.ok and a.label == "1" and a.calls.count("init_weight_transfer_engine") == 2
