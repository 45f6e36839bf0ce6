"""The direct weight load against real vLLM on CPU: our worker extension is loaded by the
session server (--worker-extension-cls), answers over /collective_rpc, and refuses on CPU
(its layers repack weights after loading), so `direct` fails at init naming why and
`auto` falls back to vLLM's own flow, whose update still lands. The direct load itself
needs CUDA: it runs in scripts/gpu/run_sync_bench.sh (docs/gpu.md).
"""

from __future__ import annotations

import pytest

from agrpo.launcher.vllm_process import WORKER_EXTENSION
from agrpo.services.trainer.weight_sync import WeightSyncer
from agrpo.services.trainer.weight_sync.transports import HttpTransport, named_weights
from trainer_helpers import greedy, vllm_greedy
from vllm_server import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]


def test_extension_answers_and_refuses_on_cpu(shared_vllm):
    out = shared_vllm.post_json("/collective_rpc", {"method": "agrpo_direct_load_check"})
    [worker] = out["results"]
    assert worker["ok"] is False and "repack" in worker["why"]
    with pytest.raises(RuntimeError, match="direct weight load refused"):
        shared_vllm.post_json("/collective_rpc", {"method": "agrpo_load_weights", "args": ["{}"]})
    # the CUDA IPC load (vLLM on the trainer's GPU) refuses for the same reason
    out = shared_vllm.post_json("/collective_rpc", {"method": "agrpo_ipc_check", "args": ["GPU-x"]})
    [worker] = out["results"]
    assert worker["ok"] is False and "repack" in worker["why"] and worker["uuid"] == ""
    with pytest.raises(RuntimeError, match="direct weight load refused"):
        shared_vllm.post_json("/collective_rpc", {"method": "agrpo_load_ipc", "args": ["{}"]})


async def test_direct_refused_auto_falls_back_and_lands(shared_vllm, tiny_model_factory):
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(str(tiny_model_factory(2)), dtype="float32").eval()
    transport = HttpTransport()
    prepare = lambda: transport.prepare(named_weights(new), 5)  # noqa: E731

    forced = WeightSyncer([shared_vllm.base_url], transport, 30.0, 120.0, load_mode="direct")
    await forced.open()
    report = await forced.sync(5, prepare)
    await forced.close()
    err = report.errors[shared_vllm.base_url]
    assert err.phase == "init" and "weight_load=direct" in err.detail and "repack" in err.detail
    assert shared_vllm.get_json("/is_paused")["is_paused"] is False  # refused before pausing anything

    auto = WeightSyncer([shared_vllm.base_url], transport, 30.0, 120.0, load_mode="auto")
    await auto.open()
    report = await auto.sync(5, prepare)
    await auto.close()
    assert report.ok and "start" in report.phase_s  # vLLM's flow (start/finish), not the direct one
    assert shared_vllm.get_json("/weight_info")["weight_version"] == "5"
    prompt = [5, 9, 14, 3]
    assert vllm_greedy(shared_vllm, prompt) == greedy(new, prompt, 12)


class _NoExtensionServer(VLLMServer):
    """vLLM as users often run it: no agrpo worker extension."""

    BASE_ARGS = tuple(a for a in VLLMServer.BASE_ARGS if a not in ("--worker-extension-cls", WORKER_EXTENSION))


@pytest.mark.slow
async def test_server_without_the_extension_syncs_through_vllms_flow(tiny_model_dir, tiny_model_factory):
    """The probe fails with HTTP 500 there, after which vLLM drops the connection: the next
    phases must not reuse it (they did, and every cold sync failed with a reset)."""
    import asyncio

    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(str(tiny_model_factory(3)), dtype="float32").eval()
    server = await asyncio.to_thread(_NoExtensionServer(tiny_model_dir).start)
    transport = HttpTransport()
    syncer = WeightSyncer([server.base_url], transport, 30.0, 120.0, load_mode="auto")
    await syncer.open()
    try:
        for version in (1, 2):
            report = await syncer.sync(version, lambda v=version: transport.prepare(named_weights(new), v))
            assert report.ok, report.errors
        assert server.get_json("/weight_info")["weight_version"] == "2"
        prompt = [7, 3, 11, 2]
        assert vllm_greedy(server, prompt) == greedy(new, prompt, 12)
    finally:
        await syncer.close()
        await asyncio.to_thread(server.stop)
