"""Push a policy version into every configured vLLM server.

Per server: [init (first time, or after a failure)] -> pause?mode=keep -> start ->
update (transport) -> finish {"weight_version": str(version)} -> reset_prefix_cache ->
resume. Each phase has `phase_timeout`, the whole server sync `total_timeout`; any
failure is a WeightSyncError naming the phase. Servers are synced concurrently; one
that fails is reported (not fatal) and left paused so it never serves half-loaded
weights. `reconcile` re-syncs every server whose /weight_info label is not the
current version: a restarted server comes back with "default", a failed one with an
old label.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from services.common.logging import get_logger

from .client import VLLMAdmin, WeightSyncError
from .transports import Prepared

log = get_logger("trainer.weight_sync")

PhaseHook = Callable[[str, str], Awaitable[None]]
PARTIAL_LABEL = "partial"
PHASES = ("init", "pause", "start", "update", "finish", "reset_prefix_cache", "resume")


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


class _Server:
    def __init__(self, admin: VLLMAdmin) -> None:
        self.admin = admin
        self.initialized = False
        self.label: str | None = None


class WeightSyncer:
    """Drives the RL weight-update flow on all servers with one transport."""

    def __init__(self, urls: list[str], transport, phase_timeout: float, total_timeout: float,
                 on_phase: PhaseHook | None = None) -> None:
        self.urls = list(urls)
        self.transport = transport
        self.phase_timeout, self.total_timeout = phase_timeout, total_timeout
        self.on_phase = on_phase
        self._session: aiohttp.ClientSession | None = None
        self._servers: dict[str, _Server] = {}
        self._prepared: Prepared | None = None

    async def open(self) -> None:
        self._session = aiohttp.ClientSession()
        self._servers = {u: _Server(VLLMAdmin(u, self._session, self.phase_timeout)) for u in self.urls}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.transport.close()

    def admin(self, url: str) -> VLLMAdmin:
        return self._servers[url].admin

    async def sync(self, version: int, prepare: Callable[[], Prepared],
                   urls: list[str] | None = None) -> SyncReport:
        """Prepare the payload (in a thread) and push it to `urls` (default: all)."""
        t0 = time.perf_counter()
        if self._prepared is None or self._prepared.version != version:
            self._prepared = await asyncio.to_thread(prepare)
        report = SyncReport(version, nbytes=self._prepared.nbytes, uri=self._prepared.uri)
        report.phase_s["prepare"] = time.perf_counter() - t0
        targets = self.urls if urls is None else urls
        results = await asyncio.gather(*(self._sync_one(u, self._prepared, report) for u in targets),
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
        report.phase_s["total"] = time.perf_counter() - t0
        return report

    async def _sync_one(self, url: str, prepared: Prepared, report: SyncReport) -> None:
        server = self._servers[url]
        current = ["connect"]
        try:
            await asyncio.wait_for(self._phases(server, prepared, report, current), self.total_timeout)
        except asyncio.TimeoutError:
            raise WeightSyncError(current[0], url,
                                  f"whole sync exceeded weight_sync_timeout={self.total_timeout:.1f} s") from None

    async def _phases(self, server: _Server, prepared: Prepared, report: SyncReport,
                      current: list[str]) -> None:
        admin, label = server.admin, str(prepared.version)
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        if not server.initialized:
            steps.append(("init", lambda: self.transport.init(admin)))
        steps += [("pause", admin.pause), ("start", lambda: self._start(admin)),
                  ("update", lambda: self.transport.send(admin, prepared)),
                  ("finish", lambda: admin.finish(label)),
                  ("reset_prefix_cache", admin.reset_prefix_cache), ("resume", admin.resume)]
        for phase, run in steps:
            current[0] = phase
            if self.on_phase is not None:
                await self.on_phase(admin.url, phase)
            t = time.perf_counter()
            try:
                await run()
            except WeightSyncError:
                if phase in ("update", "finish"):
                    await self._abandon_update(admin)
                raise
            dt = time.perf_counter() - t
            report.phase_s[phase] = max(report.phase_s.get(phase, 0.0), dt)
            if phase == "init":
                server.initialized = True
        server.label = label

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

    async def _abandon_update(self, admin: VLLMAdmin) -> None:
        """Best effort after a failed update: close it under a label that matches no
        version (so reconcile re-syncs) and stay paused (never serve half-loaded weights)."""
        try:
            await admin.call("finish", "POST", "/finish_weight_update", {"weight_version": PARTIAL_LABEL},
                             timeout=min(self.phase_timeout, 10.0))
        except WeightSyncError as exc:
            log.warning("could not close the failed update on %s: %s", admin.url, exc.detail)

    async def stale_servers(self, version: int) -> dict[str, str]:
        """Servers whose weight label is not `version` -> their label (or the error)."""
        async def check(url: str) -> tuple[str, str | None]:
            try:
                label = await self._servers[url].admin.weight_label()
            except WeightSyncError as exc:
                return url, f"unreachable: {exc.detail}"
            return url, None if label == str(version) else label
        results = await asyncio.gather(*(check(u) for u in self.urls))
        return {u: why for u, why in results if why is not None}

    async def reconcile(self, version: int, prepare: Callable[[], Prepared]) -> SyncReport | None:
        """Re-sync reachable servers that report another label (restarted or failed)."""
        stale = await self.stale_servers(version)
        targets = [u for u, why in stale.items() if not why.startswith("unreachable")]
        if not targets:
            return None
        for u in targets:
            log.warning("vLLM %s reports weight label %r, expected %r: re-syncing", u, stale[u], str(version))
            self._servers[u].initialized = False
        return await self.sync(version, prepare, targets)
