"""Push a policy version into every configured vLLM server.

Per server, vLLM's RL flow ("vllm" load): [init (first time, or after a failure)] ->
pause?mode=keep -> start -> update (transport) -> finish {"weight_version": str(version)}
-> resume. /pause already resets the prefix cache and preempts running requests (its
clear_cache default), so no separate reset is sent.

"direct" load (our worker extension, vllm_plugin/agrpo_vllm_plugin/worker.py; CUDA,
unquantized): sleep?level=0&mode=keep -> update through /collective_rpc (plain
load_weights, no layerwise reload) -> reset_prefix_cache?reset_running_requests=true
-> label (/update_weight_version, where the server keeps labels) -> resume. The same
cache semantics as /pause, without its 20 ms settle sleep and the reload machinery.
"auto" asks each server's extension at init and falls back to "vllm". The ipc transport
(vLLM on the trainer's GPU, weight_sync/ipc.py) always loads directly.

"swap" (vLLM's flow with a transport whose payload travels in the request: http, shared_path;
the server's engine must have our plugin, asked at init): all of the above in one
/collective_rpc call, `agrpo_swap`, that vLLM's engine core runs itself between two scheduler
steps (vllm_plugin/agrpo_vllm_plugin/swap.py). Generation stops for the load only, not for
six HTTP round trips.

"adapter" (a LoRA trainer, servers with runtime LoRA, weight_sync/adapter_sync.py): stage the
adapter on the server -> /v1/load_lora_adapter as agrpo-v<version> -> unregister the oldest
kept. No pause (requests keep the adapter they named) and no label: the base weights are untouched.

Each phase has `phase_timeout`, the whole server sync `total_timeout`; any failure is a
WeightSyncError naming the phase. Servers are synced concurrently; one that fails is
reported (not fatal) and left paused so it never serves half-loaded weights.
`reconcile` re-syncs every server whose /weight_info label is not the current
version: a restarted server comes back with "default", a failed one with an old label.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from agrpo.services.common.logging import get_logger
from agrpo.services.common.versions import adapter_name
from agrpo.services.common.vllm_api import parse_vllm_version

from .adapter_sync import AdapterSync
from .base import Prepared, WeightTransport
from .client import SWAP_METHOD, VLLMAdmin, WeightSyncError

log = get_logger("trainer.weight_sync")

PhaseHook = Callable[[str, str], Awaitable[None]]
PARTIAL_LABEL = "partial"
LOAD_MODES = ("auto", "vllm", "direct")


@dataclass
class SyncReport:
    """Outcome of one sync round: who has the version, who failed, and phase timings."""

    version: int
    synced: list[str] = field(default_factory=list)
    errors: dict[str, WeightSyncError] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict)  # max over servers
    nbytes: int = 0
    uri: str = ""

    @property
    def ok(self) -> bool:
        return not self.errors


def _first_answer(results: list) -> dict:
    """The engine's answer to agrpo_swap: the one dict /collective_rpc returns, else {}."""
    return results[0] if results and isinstance(results[0], dict) else {}


class _Server:
    def __init__(self, admin: VLLMAdmin) -> None:
        self.admin = admin
        self.initialized = False
        self.label: str | None = None
        self.labels = True  # the server keeps a weight label (direct load asks; vLLM's flow always sends it)
        self.quick_pause = False  # pause with /sleep level 0 (vLLM >= 0.26), not /pause's 20 ms settle sleep
        self.swap = False  # the whole vLLM flow in one agrpo_swap call (the engine has our plugin)
        self.held = False  # paused by WeightSyncer.hold, not yet resumed


class WeightSyncer:
    """Drives the RL weight-update flow on all servers with one transport."""

    def __init__(self, urls: list[str], transport, phase_timeout: float, total_timeout: float,
                 on_phase: PhaseHook | None = None, load_mode: str = "auto",
                 recompute_in_flight: bool = True, swap: bool = False, adapters: AdapterSync | None = None) -> None:
        if load_mode not in LOAD_MODES:
            raise ValueError(f"weight load mode must be one of {LOAD_MODES}, got {load_mode!r}")
        self.load_mode = load_mode
        self.recompute_in_flight = recompute_in_flight  # trainer.recompute_in_flight
        self.swap = swap  # trainer.weight_swap: where the server and the transport allow it
        self.urls = list(urls)
        self.transport = transport
        self.phase_timeout, self.total_timeout = phase_timeout, total_timeout
        self.on_phase = on_phase
        self._session: aiohttp.ClientSession | None = None
        self._servers: dict[str, _Server] = {}
        self._prepared: Prepared | None = None
        self._prepare_s = 0.0  # how long the last payload took to build
        self.adapters = adapters  # a LoRA trainer's adapter-only sync (adapter_sync.py), decided at the first sync

    @property
    def payload(self) -> str:
        """What a version's payload holds: "adapter" (the LoRA adapter's tensors) or "full" weights."""
        return "adapter" if self.adapters is not None and self.adapters.active else "full"

    @property
    def payload_transport(self) -> WeightTransport:
        """What builds a version's payload: the transport, or for an adapter its carrier."""
        return self.adapters.carrier if self.adapters is not None and self.adapters.active else self.transport

    async def open(self) -> None:
        # No keep-alive: vLLM's server drops a connection after an unhandled error (a failed
        # collective RPC, say) without saying so, and a pooled one then fails the next phase
        # with "Server disconnected". A fresh local connection per call costs well under 1 ms.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        self._servers = {u: _Server(VLLMAdmin(u, self._session, self.phase_timeout)) for u in self.urls}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.transport.close()

    def admin(self, url: str) -> VLLMAdmin:
        return self._servers[url].admin

    async def hold(self) -> None:
        """Freeze every server's scheduling, its requests kept (the alternate schedule: the trainer
        computes alone). The next sync's pause is then already done and its resume releases them;
        `release` does it where no sync follows. A server that does not answer is left running."""
        async def pause(server: _Server) -> None:
            await self._pause(server)()
            server.held = True

        results = await asyncio.gather(*(pause(s) for s in self._servers.values()), return_exceptions=True)
        for url, res in zip(self._servers, results):
            if isinstance(res, Exception):
                log.warning("could not pause %s while the trainer computes: %s", url, res)

    async def release(self) -> None:
        """Resume the servers `hold` froze and no sync has resumed since."""
        held = [s for s in self._servers.values() if s.held]

        async def resume(server: _Server) -> None:
            await server.admin.resume()
            server.held = False

        results = await asyncio.gather(*(resume(s) for s in held), return_exceptions=True)
        for server, res in zip(held, results):
            if isinstance(res, Exception):
                log.warning("could not resume %s: %s", server.admin.url, res)

    async def prepare_now(self, version: int, prepare: Callable[[], Prepared]) -> None:
        """Build `version`'s payload (in a thread) unless it is built already. With a
        transport that snapshots (`transport.snapshot`), training may go on once this returns."""
        if self._prepared is None or self._prepared.version != version:
            t0 = time.perf_counter()
            self._prepared = await asyncio.to_thread(prepare)
            self._prepare_s = time.perf_counter() - t0

    async def sync(self, version: int, prepare: Callable[[], Prepared],
                   urls: list[str] | None = None) -> SyncReport:
        """Prepare the payload (in a thread, unless `prepare_now` did) and push it to `urls`
        (default: all)."""
        if self.adapters is not None and self.adapters.active is None:
            await self.adapters.choose([s.admin for s in self._servers.values()])
        await self.prepare_now(version, prepare)
        prepared = self._prepared
        assert prepared is not None  # prepare_now() just built it (nothing resets it)
        t0 = time.perf_counter()
        report = SyncReport(version, nbytes=prepared.nbytes, uri=prepared.uri)
        # the build's time, once (the loop's prepare_now may have built it a moment earlier)
        report.phase_s["prepare"], self._prepare_s = self._prepare_s, 0.0
        targets = self.urls if urls is None else urls
        results = await asyncio.gather(*(self._sync_one(u, prepared, report) for u in targets),
                                       return_exceptions=True)
        for url, res in zip(targets, results):
            if isinstance(res, WeightSyncError):
                report.errors[url] = res
                self._servers[url].initialized = False
                log.error("%s", res)
            elif isinstance(res, BaseException):
                raise res
            else:
                report.synced.append(url)
        report.phase_s["total"] = report.phase_s["prepare"] + time.perf_counter() - t0
        return report

    async def _sync_one(self, url: str, prepared: Prepared, report: SyncReport) -> None:
        server = self._servers[url]
        current = ["connect"]
        try:
            await asyncio.wait_for(self._phases(server, prepared, report, current), self.total_timeout)
        except TimeoutError:
            raise WeightSyncError(current[0], url,
                                  f"whole sync exceeded weight_sync_timeout={self.total_timeout:.1f} s") from None

    async def _phases(self, server: _Server, prepared: Prepared, report: SyncReport,
                      current: list[str]) -> None:
        admin = server.admin
        adapters = self.adapters
        if adapters is not None and adapters.active:  # no pause, no weight-update flow: one more adapter
            for phase, run in adapters.phases(admin, prepared):
                await self._phase(server, phase, run, report, current)
            server.label = str(prepared.version)
            return
        if not server.initialized:
            await self._phase(server, "init", lambda: self._init(server), report, current)
            server.initialized = True
        if server.swap:  # the engine pauses and resumes itself around the load
            await self._phase(server, "update", lambda: self._swap(admin, prepared, report), report, current)
            server.held = False
        else:
            phases = self._update_steps(server, prepared)
            if not server.held:  # `hold` paused it already
                phases.insert(0, ("pause", self._pause(server)))
            for phase, run in phases:
                await self._phase(server, phase, run, report, current)
            server.held = False  # the update's last phase resumed it
        server.label = str(prepared.version)

    def _pause(self, server: _Server) -> Callable[[], Awaitable[None]]:
        """A sync's pause: /sleep level 0 where the server has it (the update resets the cache
        after), else /pause, which resets it itself (or not: recompute_in_flight)."""
        admin = server.admin
        if admin.direct or server.quick_pause:
            return admin.pause_scheduler
        return lambda: admin.pause(clear_cache=self.recompute_in_flight)

    async def _swap(self, admin: VLLMAdmin, prepared: Prepared, report: SyncReport) -> None:
        """vLLM's flow in one call that the engine core runs between two scheduler steps; its
        own timings become the phases drain (waiting for the step in flight), load and reset."""
        spec = {"calls": [{"method": "start_weight_update"},
                          *({"method": "update_weights", "kwargs": {"update_info": info}}
                            for info in prepared.update_infos),
                          {"method": "finish_weight_update"}],
                "on_failure": [{"method": "finish_weight_update"}],
                "label": str(prepared.version), "failed_label": PARTIAL_LABEL,
                # Kept requests hold cache blocks, so the cache cannot be reset under them; rollout
                # salts each prompt's cache by version instead (Group.cache_salt).
                "reset_prefix_cache": self.recompute_in_flight, "reset_running": self.recompute_in_flight,
                "timeout": self.phase_timeout}
        results = await admin.rpc("update", SWAP_METHOD, json.dumps(spec))
        answer = _first_answer(results)
        if not answer.get("ok"):
            raise WeightSyncError("update", admin.url, f"agrpo_swap refused: {answer.get('why') or results!r}")
        for phase, key in (("drain", "drain_s"), ("load", "load_s"), ("reset_prefix_cache", "reset_s")):
            report.phase_s[phase] = max(report.phase_s.get(phase, 0.0), float(answer.get(key, 0.0)))

    async def _phase(self, server: _Server, phase: str, run: Callable[[], Awaitable[None]],
                     report: SyncReport, current: list[str]) -> None:
        """Run one phase, time it (max over servers); a failed load is closed as partial."""
        current[0] = phase
        if self.on_phase is not None:
            await self.on_phase(server.admin.url, phase)
        t = time.perf_counter()
        try:
            await run()
        except WeightSyncError:
            if phase in ("update", "reset_prefix_cache", "finish") and not server.swap:
                await self._abandon_update(server)  # a failed swap closed the update itself
            raise
        report.phase_s[phase] = max(report.phase_s.get(phase, 0.0), time.perf_counter() - t)

    def _update_steps(self, server: _Server, prepared: Prepared) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """The phases after pause: decided late, since init settles the server's load mode."""
        admin, label = server.admin, str(prepared.version)
        send = ("update", lambda: self.transport.send(admin, prepared))
        if not admin.direct:
            steps = [("start", lambda: self._start(admin)), send, ("finish", lambda: self._close(server, label))]
            if server.quick_pause:  # what /pause's clear_cache did
                steps.append(("reset_prefix_cache", self._reset_cache(admin)))
            return steps + [("resume", admin.resume)]
        steps = [send, ("reset_prefix_cache", self._reset_cache(admin))]
        if server.labels:
            steps.append(("finish", lambda: self._close(server, label)))
        return steps + [("resume", admin.resume)]

    def _reset_cache(self, admin: VLLMAdmin) -> Callable[[], Awaitable[None]]:
        """Drop the prefix cache of the old weights; with recompute_in_flight, running requests
        are preempted and recomputed under the new ones (else they keep their KV cache)."""
        return lambda: admin.reset_prefix_cache(running=self.recompute_in_flight)

    @staticmethod
    async def _close(server: _Server, label: str, timeout: float | None = None) -> None:
        """End an update under `label`: finish_weight_update in vLLM's flow; for a direct
        load only the label, where the server keeps one."""
        if not server.admin.direct:
            await server.admin.finish(label, timeout)
        elif server.labels:
            await server.admin.set_label(label, timeout)

    async def _init(self, server: _Server) -> None:
        """The transport's rendezvous, the load mode this server supports, and whether vLLM's
        flow goes as one swap."""
        await self._settle_load_mode(server)
        server.swap = not server.admin.direct and await self._can_swap(server.admin)

    async def _settle_load_mode(self, server: _Server) -> None:
        admin = server.admin
        await self.transport.init(admin)
        admin.direct = False
        server.quick_pause = parse_vllm_version(await admin.server_version()) >= (0, 26, 0)
        if self.transport.direct_only:  # its init checked the extension
            admin.direct, server.labels = True, await admin.has_weight_labels()
            return
        if self.load_mode == "vllm":
            return
        why = await admin.direct_load_check()
        if why is None:
            admin.direct, server.labels = True, await admin.has_weight_labels()
            log.info("%s: direct weight load (worker extension)%s", admin.url,
                     "" if server.labels else "; no weight labels on this server")
        elif self.load_mode == "direct":
            raise WeightSyncError("init", admin.url, f"trainer.weight_load=direct, but {why}")
        else:
            log.info("%s: vLLM's weight-update flow (no direct load: %s)", admin.url, why)

    async def _can_swap(self, admin: VLLMAdmin) -> bool:
        """trainer.weight_swap, a transport whose payload is in the request, and a server
        whose engine core answers the swap's probe."""
        if not (self.swap and self.transport.in_band):
            return False
        try:
            results = await admin.rpc("init", SWAP_METHOD, json.dumps({"probe": True}))
        except WeightSyncError as exc:
            log.info("%s: one HTTP call per weight-sync phase (no agrpo_swap: %s)", admin.url, exc.detail[:200])
            return False
        answer = _first_answer(results)
        if not answer.get("ok"):
            log.info("%s: one HTTP call per weight-sync phase (%s)", admin.url, answer.get("why") or results)
            return False
        log.info("%s: weights swap in one call inside vLLM's engine (agrpo_swap)", admin.url)
        return True

    async def _start(self, admin: VLLMAdmin) -> None:
        """start_weight_update; if an earlier failed sync left one active, close it first."""
        try:
            await admin.start()
        except WeightSyncError as exc:
            if "already active" not in exc.detail:
                raise
            log.warning("%s: closing a weight update left active by a failed sync", admin.url)
            await admin.finish(PARTIAL_LABEL)
            await admin.start()

    async def _abandon_update(self, server: _Server) -> None:
        """Best effort after a failed update: close it under a label that matches no
        version (so reconcile re-syncs) and stay paused (never serve half-loaded weights)."""
        try:
            await self._close(server, PARTIAL_LABEL, min(self.phase_timeout, 10.0))
        except WeightSyncError as exc:
            log.warning("could not close the failed update on %s: %s", server.admin.url, exc.detail)

    async def stale_servers(self, version: int) -> dict[str, str]:
        """Servers that do not serve `version` -> why: their weight label, the adapter they lack, or the error."""
        async def check(url: str) -> tuple[str, str | None]:
            admin = self._servers[url].admin
            try:
                if self.payload == "adapter":
                    serves = await AdapterSync.serves(admin, version)
                    return url, None if serves else f"lists no adapter {adapter_name(version)}"
                label = await admin.weight_label()
            except WeightSyncError as exc:
                return url, f"unreachable: {exc.detail}"
            return url, None if label == str(version) else f"reports weight label {label!r}"
        results = await asyncio.gather(*(check(u) for u in self.urls))
        return {u: why for u, why in results if why is not None}

    async def reconcile(self, version: int, prepare: Callable[[], Prepared]) -> SyncReport | None:
        """Re-sync reachable servers that report another label (restarted or failed)."""
        stale = await self.stale_servers(version)
        targets = [u for u, why in stale.items() if not why.startswith("unreachable")]
        if not targets:
            return None
        for u in targets:
            log.warning("vLLM %s %s, expected version %d: re-syncing", u, stale[u], version)
            self._servers[u].initialized = False
        return await self.sync(version, prepare, targets)
