"""HTTP calls to one vLLM server's RL/dev endpoints, each with a timeout and a checked status.

Every failure is a `WeightSyncError` naming the phase and the server, so a dead or
hung server shows up as "phase 'update' on http://...: ..." instead of a hang.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp


class WeightSyncError(RuntimeError):
    """A weight-sync phase failed (HTTP error, timeout, refused connection)."""

    def __init__(self, phase: str, url: str, detail: str) -> None:
        super().__init__(f"weight sync phase {phase!r} on {url}: {detail}")
        self.phase, self.url, self.detail = phase, url, detail


DIRECT_CHECK = "agrpo_direct_load_check"
DIRECT_LOAD = "agrpo_load_weights"
IPC_CHECK = "agrpo_ipc_check"  # the CUDA IPC transport's (weight_sync/ipc.py); NCCL asks it too
IPC_LOAD = "agrpo_load_ipc"
SWAP_METHOD = "agrpo_swap"  # handled by vLLM's engine core itself (vllm_plugin/agrpo_vllm_plugin/swap.py)


class VLLMAdmin:
    """One server's admin surface; phases are named for errors and timings.

    `direct` (set by the syncer once the server's worker extension agreed) sends the
    update through our extension's direct load instead of /update_weights.
    """

    def __init__(self, base_url: str, session: aiohttp.ClientSession, phase_timeout: float) -> None:
        self.url = base_url.rstrip("/")
        self.session = session
        self.phase_timeout = phase_timeout
        self.direct = False
        self.last_rpc: list = []  # the extension's per-worker results of the last direct load

    async def call(self, phase: str, method: str, path: str, body: Any = None,
                   timeout: float | None = None) -> Any:
        """One request; non-2xx, timeouts and connection errors raise WeightSyncError."""
        limit = aiohttp.ClientTimeout(total=timeout or self.phase_timeout)
        try:
            async with self.session.request(method, self.url + path, json=body, timeout=limit) as r:
                text = await r.text()
                if r.status // 100 != 2:
                    raise WeightSyncError(phase, self.url, f"HTTP {r.status}: {text[:500]}")
                if not text:
                    return None
                try:
                    return await r.json(content_type=None)
                except ValueError:
                    return text
        except TimeoutError:
            raise WeightSyncError(phase, self.url, f"timed out after {timeout or self.phase_timeout:.1f} s") from None
        except aiohttp.ClientError as exc:
            raise WeightSyncError(phase, self.url, f"{type(exc).__name__}: {exc}") from None

    async def weight_label(self) -> str:
        data = await self.call("weight_info", "GET", "/weight_info")
        return str(data.get("weight_version", ""))

    async def server_version(self) -> str:
        data = await self.call("version", "GET", "/version")
        return str(data.get("version", "0"))

    async def max_model_len(self) -> int:
        data = await self.call("models", "GET", "/v1/models")
        return int(data["data"][0]["max_model_len"])

    async def init_engine(self, init_info: dict) -> None:
        await self.call("init", "POST", "/init_weight_transfer_engine", {"init_info": init_info})

    async def pause(self, clear_cache: bool = True) -> None:
        """Freeze scheduling; `clear_cache` also preempts running requests (recomputed on resume)."""
        await self.call("pause", "POST", "/pause?mode=keep" + ("" if clear_cache else "&clear_cache=false"))

    async def start(self) -> None:
        await self.call("start", "POST", "/start_weight_update", {"is_checkpoint_format": True})

    async def update(self, update_info: dict) -> None:
        if self.direct:
            self.last_rpc = await self.rpc("update", DIRECT_LOAD, json.dumps(update_info))
            return
        await self.call("update", "POST", "/update_weights", {"update_info": update_info})

    async def rpc(self, phase: str, method: str, *args: str) -> list:
        """POST /collective_rpc: a worker method on every worker, between scheduler steps."""
        body = {"method": method, "args": list(args), "timeout": self.phase_timeout}
        data = await self.call(phase, "POST", "/collective_rpc", body)
        return (data or {}).get("results", []) if isinstance(data, dict) else []

    async def direct_load_check(self) -> str | None:
        """None when every worker may load directly, else why not (extension missing...)."""
        try:
            results = await self.rpc("init", DIRECT_CHECK)
        except WeightSyncError as exc:
            return ("the agrpo worker extension does not answer (start vLLM with --worker-extension-cls "
                    f"agrpo_vllm_plugin.worker.AgrpoWorkerExtension): {exc.detail[:200]}")
        refusals = [r.get("why", "?") for r in results if not (isinstance(r, dict) and r.get("ok"))]
        return "; ".join(refusals) or (None if results else "no worker answered")

    async def has_weight_labels(self) -> bool:
        """True when the server keeps a weight label (GET /weight_info; vLLM >= 0.30)."""
        try:
            await self.weight_label()
        except WeightSyncError:
            return False
        return True

    async def pause_scheduler(self) -> None:
        """Freeze scheduling, keep requests, clear nothing (no 20 ms settle sleep as in /pause)."""
        await self.call("pause", "POST", "/sleep?level=0&mode=keep")

    async def set_label(self, label: str, timeout: float | None = None) -> None:
        await self.call("finish", "POST", "/update_weight_version", {"new_version": label}, timeout)

    async def finish(self, label: str, timeout: float | None = None) -> None:
        await self.call("finish", "POST", "/finish_weight_update", {"weight_version": label}, timeout)

    async def reset_prefix_cache(self, running: bool = False) -> None:
        """Drop cached KV; `running` also preempts running requests (recomputed on resume)."""
        query = "?reset_running_requests=true" if running else ""
        await self.call("reset_prefix_cache", "POST", "/reset_prefix_cache" + query)

    async def resume(self) -> None:
        await self.call("resume", "POST", "/resume")
