"""weight_transport local: the trainer serves generation itself, so publishing a version is a
memory copy into its generator's model (services/trainer/generation/).

LocalSyncer offers what the loop asks of WeightSyncer (open/close, prepare_now, sync,
reconcile, admin(url), urls, transport). The copy happens in `prepare_now`, right after the
step that made the version and before the next one changes the weights, and sets the
generator's label in the same breath, so every token is sampled under exactly the weights its
label names. The generator answers at the one configured vLLM URL (host and port).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import torch

from agrpo.services.common.logging import get_logger

from .base import Prepared, WeightTransport
from .orchestrator import SyncReport

if TYPE_CHECKING:
    from aiohttp import web

    from agrpo.services.trainer.generation.generator import Generator

log = get_logger("trainer.weight_sync.local")


class LocalTransport(WeightTransport):
    """Nothing travels: the generator copies the trainer's weights in its own process
    (LocalSyncer does the copy; this class only names the transport)."""

    name = "local"

    @classmethod
    def from_config(cls, cfg, device: torch.device) -> LocalTransport:
        return cls()

    def prepare(self, named, version: int) -> Prepared:
        raise NotImplementedError("weight_transport local copies in LocalSyncer.prepare_now")

    async def send(self, admin, prepared: Prepared) -> None:
        raise NotImplementedError("weight_transport local sends nothing")


class _LocalAdmin:
    """The two questions the loop asks a server's admin: its max_model_len and weight label."""

    def __init__(self, syncer: LocalSyncer) -> None:
        self.syncer = syncer

    async def max_model_len(self) -> int:
        return self.syncer.opened_generator.max_model_len

    async def weight_label(self) -> str:
        return self.syncer.opened_generator.label


class LocalSyncer:
    """Serves generation from a copy of `model` and publishes versions into it."""

    def __init__(self, url: str, model: torch.nn.Module, stop_ids: set[int], max_model_len: int,
                 model_name: str, seed: int) -> None:
        self.urls = [url]
        self.model, self.stop_ids, self.max_model_len = model, stop_ids, max_model_len
        self.model_name, self.seed = model_name, seed
        self.transport = LocalTransport()
        self.payload = "full"  # the generator copies the model as it is (a LoRA adapter included)
        self.generator: Generator | None = None  # open() builds it
        self._runner: web.AppRunner | None = None
        self._serving: asyncio.Task | None = None

    async def open(self) -> None:
        """Copy the model, start the batching loop and the HTTP routes."""
        from agrpo.services.trainer.generation import server
        from agrpo.services.trainer.generation.generator import Generator

        self.generator = generator = await asyncio.to_thread(Generator, self.model, self.stop_ids,
                                                             self.max_model_len, self.seed)
        self._serving = asyncio.create_task(generator.serve())
        where = urlparse(self.urls[0])
        host = "127.0.0.1" if where.hostname in ("localhost", "127.0.0.1") else "0.0.0.0"
        self._runner = await server.start(generator, self.model_name, host, where.port or 80)

    @property
    def opened_generator(self) -> Generator:
        """The generator, which open() built: the loop opens the syncer before it asks anything."""
        assert self.generator is not None
        return self.generator

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._serving is not None:
            self._serving.cancel()
            await asyncio.gather(self._serving, return_exceptions=True)
            self._serving = None

    def admin(self, url: str) -> _LocalAdmin:
        return _LocalAdmin(self)

    async def hold(self) -> None:
        """The generator shares the trainer's process and device; nothing to pause."""

    async def release(self) -> None:
        """See hold."""

    async def prepare_now(self, version: int, prepare=None) -> float:
        """Copy the trainer's weights in as `version` (unless they are in already); seconds taken."""
        generator = self.opened_generator
        if generator.label == str(version):
            return 0.0
        t0 = time.perf_counter()
        await asyncio.to_thread(generator.load, self.model, str(version))
        return time.perf_counter() - t0

    async def sync(self, version: int, prepare=None, urls: list[str] | None = None) -> SyncReport:
        load_s = await self.prepare_now(version)
        return SyncReport(version, synced=list(self.urls), phase_s={"load": load_s, "total": load_s})

    async def reconcile(self, version: int, prepare=None) -> SyncReport | None:
        """The generator lives and dies with the trainer: it never misses a version."""
        return None
