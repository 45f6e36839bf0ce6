"""Weight sync against a second real vLLM server that hangs, then dies, mid-sync.

Fault injection uses a real vLLM process (no stand-in): SIGSTOP freezes it during the
`update` phase (the phase timeout must fire and name the phase), SIGKILL of its
process group kills it during `update` (the connection error must name the phase),
and after a restart on the same port `reconcile` finds the wrong label ("default")
and re-syncs it, after which its greedy output equals HF's on the pushed weights.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from agrpo.services.trainer.weight_sync import WeightSyncer
from agrpo.services.trainer.weight_sync.transports import HttpTransport, named_weights
from trainer_helpers import greedy, vllm_greedy
from vllm_server import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

PHASE_TIMEOUT = 5.0


async def test_hang_and_death_mid_sync_then_resync(tiny_model_dir, tiny_model_factory):
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(str(tiny_model_factory(1)), dtype="float32").eval()
    transport = HttpTransport()
    server = await asyncio.to_thread(VLLMServer(tiny_model_dir).start)
    fault: dict[str, str | None] = {"mode": None}

    async def hook(url: str, phase: str) -> None:
        if phase != "update" or fault["mode"] is None:
            return
        if fault["mode"] == "hang":
            os.killpg(server.proc.pid, signal.SIGSTOP)
        else:
            await asyncio.to_thread(server.stop, 2.0)

    syncer = WeightSyncer([server.base_url], transport, PHASE_TIMEOUT, 60.0, on_phase=hook)
    await syncer.open()
    prepare = lambda: transport.prepare(named_weights(new), 1)  # noqa: E731
    try:
        fault["mode"] = "hang"
        t0 = time.monotonic()
        report = await syncer.sync(1, prepare)
        err = report.errors[server.base_url]
        assert err.phase == "update" and "timed out" in err.detail
        assert time.monotonic() - t0 < PHASE_TIMEOUT + 10
        os.killpg(server.proc.pid, signal.SIGCONT)

        fault["mode"] = "die"
        report = await syncer.sync(1, prepare)
        err = report.errors[server.base_url]
        assert err.phase == "update" and not report.synced
        assert "update" in str(err) and server.base_url in str(err)

        fault["mode"] = None
        await asyncio.to_thread(server.start)  # same port: the "same" server came back
        assert await syncer.stale_servers(1) == {server.base_url: "reports weight label 'default'"}
        report = await syncer.reconcile(1, prepare)
        assert report is not None and report.synced == [server.base_url] and report.ok
        assert set(report.phase_s) >= {"init", "pause", "start", "update", "finish", "resume"}
        assert server.get_json("/weight_info")["weight_version"] == "1"
        assert await syncer.stale_servers(1) == {}
        for prompt in ([5, 17, 99, 42], [1, 300, 301, 302, 7]):
            assert vllm_greedy(server, prompt) == greedy(new, prompt)
    finally:
        await syncer.close()
        if server.proc is not None:
            try:
                os.killpg(server.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        await asyncio.to_thread(server.stop)
