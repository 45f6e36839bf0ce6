"""Weight-sync orchestration rules against small aiohttp stand-ins of vLLM's RL routes.

Unit level only (one component, fake peers): the phase order, the label sent to
finish, partial failure across servers, the whole-sync timeout naming the phase, and
recovery from an update left active. The real-vLLM versions of these live in
tests/integration/trainer/.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from services.trainer.weight_sync import WeightSyncer
from services.trainer.weight_sync.transports import Prepared


class FakeVLLM:
    def __init__(self, hang_on: str | None = None, fail_on: str | None = None) -> None:
        self.calls: list[str] = []
        self.label = "default"
        self.active = False
        self.hang_on, self.fail_on = hang_on, fail_on
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        name = request.path.strip("/")
        self.calls.append(name)
        body = await request.json() if request.can_read_body else {}
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
        if name == "weight_info":
            return web.json_response({"weight_version": self.label})
        return web.json_response({"status": "ok"})

    async def start(self) -> "FakeVLLM":
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


class NoopTransport:
    name = "http"

    async def init(self, admin) -> None:
        await admin.init_engine({})

    async def send(self, admin, prepared) -> None:
        for info in prepared.update_infos:
            await admin.update(info)

    def close(self) -> None:
        pass


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
    assert a.calls == ["init_weight_transfer_engine", "pause", "start_weight_update", "update_weights",
                       "update_weights", "finish_weight_update", "reset_prefix_cache", "resume"]
    assert a.label == "3"


async def test_one_failing_server_does_not_block_the_others(servers):
    good, bad = await servers(), await servers(fail_on="pause")
    syncer = WeightSyncer([good.url, bad.url], NoopTransport(), 5.0, 30.0)
    await syncer.open()
    report = await syncer.sync(1, _prepare(1))
    assert report.synced == [good.url]
    assert report.errors[bad.url].phase == "pause" and "HTTP 500" in str(report.errors[bad.url])
    bad.fail_on = None
    assert await syncer.stale_servers(1) == {bad.url: "default"}
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
