"""Adapter-only weight sync: a LoRA trainer sends its adapter, and vLLM serves each version under a name.

Chosen at the first sync (trainer.lora_sync auto) when the trainer trains an adapter vLLM can
express and every server runs with `--enable-lora` and runtime LoRA updating
(VLLM_ALLOW_RUNTIME_LORA_UPDATING=1); else the adapted layers are synced merged, with one warning
line. lora_sync adapter makes that fallback a one-line error; merged skips adapters altogether.
Limits a server cannot meet (a rank above its --max-lora-rank, fewer than max_staleness + 2
adapter slots) are a one-line error.

Version N is adapter `agrpo-vN` (versions.adapter_name). The adapter's tensors travel through the
configured transport's payload (inline in the stage request with NCCL) into the server's own
folder (our worker extension, agrpo_vllm_plugin/adapters.py: no folder shared with the trainer),
then /v1/load_lora_adapter registers the name. Once it is announced, rollout names it in every
request it sends, so a request generates under one version from start to end, and vLLM's prefix
cache (keyed by adapter name) never mixes versions. No pause: loading an adapter leaves what
running requests use as it is. Each server keeps the newest max_staleness + 2 names; the oldest is
unregistered when its successor is in. The server's weight label stays as it was ("default": the
base weights are never written), so a request that names no adapter is honestly version 0; a
server that lost its adapters (a restart) is found by /v1/models lacking the current one.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agrpo.services.common.logging import get_logger
from agrpo.services.common.preflight import StartupError
from agrpo.services.common.versions import adapter_name

from .base import Prepared, WeightTransport
from .client import VLLMAdmin, WeightSyncError
from .transports import HttpTransport

log = get_logger("trainer.weight_sync.adapter")

STAGE = "agrpo_stage_adapter"
INFO = "agrpo_lora_info"


@dataclass(frozen=True)
class AdapterPlan:
    """What the trainer's adapter needs of a server, and why it might not be served as one."""

    config_json: str
    rank: int
    slots: int
    """Adapters a server must hold at once: max_staleness + 2 (the newest and every version a
    trainable sample may still be generated under, plus the one being loaded)."""
    blocker: str | None = None


class AdapterSync:
    """Decides adapter-only sync once for all servers, then gives each sync's phases."""

    def __init__(self, plan: AdapterPlan, transport: WeightTransport, chunk_mb: int = 64, mode: str = "auto") -> None:
        self.plan = plan
        self.mode = mode  # trainer.lora_sync: auto, adapter or merged
        self.active: bool | None = None  # None until choose() ran
        self.carrier = transport if transport.carries_adapters else HttpTransport(chunk_mb)
        """What builds an adapter's payload: the sync's transport where the worker extension stages
        what it sends (http, shared_path, ipc), else (nccl) base64 safetensors inline in the stage
        request: 1% of the model's bytes, and no merged copy of every adapted layer on the trainer."""

    async def choose(self, admins: list[VLLMAdmin]) -> bool:
        """Adapter-only sync if every server can take adapters, else merged layers (one warning;
        an error for lora_sync adapter); merged layers always for lora_sync merged."""
        if self.mode == "merged":
            log.info("LoRA: syncing the adapted layers merged (trainer.lora_sync merged)")
            return self._merged()
        if self.plan.blocker is not None:
            return self._fallback(f"{self.plan.blocker}: vLLM cannot take it as an adapter")
        infos = [(admin.url, _first(await admin.rpc("init", INFO))) for admin in admins]
        missing = [url for url, info in infos if not (info.get("enabled") and info.get("runtime_updating"))]
        if missing:
            return self._fallback(f"vLLM at {missing[0]} runs without --enable-lora and "
                                  "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1; agrpo run sets both when peft is set")
        for url, info in infos:
            self._check_limits(url, info)
        log.info("LoRA: adapter-only sync into %d server(s), %d adapters kept", len(admins), self.plan.slots)
        self.active = True
        return True

    def _fallback(self, why: str) -> bool:
        if self.mode == "adapter":
            raise StartupError(f"trainer.lora_sync=adapter, but {why}; set trainer.lora_sync auto to sync the "
                               "adapted layers merged instead")
        log.warning("LoRA: syncing the adapted layers merged (%s)", why)
        return self._merged()

    def _merged(self) -> bool:
        self.active = False
        return False

    def _check_limits(self, url: str, info: dict) -> None:
        if info["max_lora_rank"] < self.plan.rank:
            raise StartupError(f"vLLM at {url}: --max-lora-rank {info['max_lora_rank']} is below peft.r="
                               f"{self.plan.rank}: start it with --max-lora-rank {self.plan.rank} or more")
        if info["max_loras"] < self.plan.slots:
            raise StartupError(f"vLLM at {url}: --max-loras {info['max_loras']} holds fewer adapters than "
                               f"max_staleness + 2 = {self.plan.slots}: start it with --max-loras {self.plan.slots}")
        if info.get("data_parallel_size", 1) > 1:
            raise StartupError(f"vLLM at {url}: data-parallel servers cannot take adapters at run time "
                               "(start one server per GPU group, each with its own URL)")

    def phases(self, admin: VLLMAdmin, prepared: Prepared) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """Stage the adapter on the server, register its name, unregister the oldest."""
        name = adapter_name(prepared.version)
        staged: dict[str, str] = {}

        async def stage() -> None:
            results = await admin.rpc("update", STAGE, name, self.plan.config_json,
                                      json.dumps(prepared.update_infos), str(self.plan.slots))
            staged["path"] = _first(results)["path"]

        async def load() -> None:
            await _tolerating(admin.call("load", "POST", "/v1/load_lora_adapter",
                                         {"lora_name": name, "lora_path": staged["path"]}), "already")

        async def unload() -> None:
            old = prepared.version - self.plan.slots
            if old >= 1:
                await _tolerating(admin.call("unload", "POST", "/v1/unload_lora_adapter",
                                             {"lora_name": adapter_name(old)}), "not found", "404")

        return [("update", stage), ("load", load), ("unload", unload)]

    @staticmethod
    async def serves(admin: VLLMAdmin, version: int) -> bool:
        """Whether the server lists the adapter of `version` (False after a restart)."""
        data = await admin.call("models", "GET", "/v1/models")
        return any(m.get("id") == adapter_name(version) for m in (data or {}).get("data", []))


def _first(results: list) -> dict:
    answer = results[0] if results else None
    if not isinstance(answer, dict):
        raise WeightSyncError("init", "", f"the agrpo worker extension answered {answer!r} (is it installed?)")
    return answer


async def _tolerating(call: Awaitable, *benign: str) -> None:
    """A call whose refusal is fine when it says one of `benign` (already loaded, already gone)."""
    try:
        await call
    except WeightSyncError as exc:
        if not any(b in exc.detail.lower() for b in benign):
            raise
