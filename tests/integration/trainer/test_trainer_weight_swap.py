"""The one-call weight swap (trainer.weight_swap) against the session's real vLLM on CPU: our
plugin wraps the engine core's collective_rpc, the whole load runs in one request, and a
request in flight across it is split exactly where the weights changed: vLLM's per-token
version spans put the boundary at the first token the new weights produced. A failed load
leaves the server paused under the "partial" label, and the next sync recovers it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait

import pytest

from agrpo.services.trainer.weight_sync import WeightSyncer
from agrpo.services.trainer.weight_sync.transports import HttpTransport, Prepared, named_weights
from trainer_helpers import greedy, vllm_greedy

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

PROMPT = [5, 17, 99, 42]


def teacher_forced_argmax(model, ids: list[int]) -> list[int]:
    """Each position's greedy next token given the true prefix (one full forward)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    return logits.argmax(-1).tolist()


def metrics_text(server) -> str:
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=10) as r:
        return r.read().decode()


async def running(server, timeout: float = 2.0) -> None:
    """Until vLLM's gauge shows a running request, then a few decode steps; at most `timeout`
    (the gauge can miss a short request: the caller retries until a swap lands inside one)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        text = await asyncio.to_thread(metrics_text, server)
        if any(line.startswith("vllm:num_requests_running") and not line.rstrip().endswith(" 0.0")
               for line in text.splitlines()):
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)


def long_greedy_request(server, n: int, timeout: float = 120.0) -> dict:
    body = {"token_ids": PROMPT, "model": server.model_name,
            "sampling_params": {"max_tokens": n, "temperature": 0.0, "ignore_eos": True, "logprobs": 0}}
    return server.post_json("/inference/v1/generate", body, timeout=timeout)["choices"][0]


def keep_requesting(server, stop: threading.Event, delay: float, out: list[dict]) -> None:
    """Long requests one after another until `stop`: with a few of these staggered, some
    request is always mid-decode, wherever the swap lands."""
    time.sleep(delay)
    while not stop.is_set():
        out.append(long_greedy_request(server, 500))


async def test_swap_splits_requests_in_flight_exactly_where_the_weights_changed(shared_vllm, tiny_model_factory):
    from transformers import AutoModelForCausalLM

    models = {seed: AutoModelForCausalLM.from_pretrained(str(tiny_model_factory(seed)), dtype="float32").eval()
              for seed in (2, 3)}
    transport = HttpTransport()
    syncer = WeightSyncer([shared_vllm.base_url], transport, 30.0, 60.0, load_mode="vllm", swap=True)
    await syncer.open()
    split: list[tuple[dict, str, str]] = []
    pool, stop = ThreadPoolExecutor(16), threading.Event()
    try:
        assert (await syncer.sync(6, lambda: transport.prepare(named_weights(models[2]), 6))).ok  # init + a swap
        for version in range(7, 13):  # until a swap lands inside some request (timing is not ours)
            seed = 3 if version % 2 else 2
            payload = lambda v=version, m=models[seed]: transport.prepare(named_weights(m), v)  # noqa: E731
            await syncer.prepare_now(version, payload)
            # 16 at once, staggered and renewed until the swap returns: the load may take longer
            # than one request, yet some request is mid-decode when the weights change
            stop.clear()
            choices: list[dict] = []
            workers = [pool.submit(keep_requesting, shared_vllm, stop, 0.1 * i, choices) for i in range(16)]
            await running(shared_vllm)
            report = await syncer.sync(version, payload)
            stop.set()
            await asyncio.gather(*(asyncio.wrap_future(w) for w in workers))
            assert report.ok and {"drain", "load", "update"} <= set(report.phase_s) and "start" not in report.phase_s
            for choice in choices:
                spans = [(s["version"], s["start"], s["end"]) for s in choice["weight_versions"]]
                assert [v for v, _, _ in spans] in ([str(version - 1)], [str(version)],
                                                    [str(version - 1), str(version)]), spans
                if len(spans) == 2:
                    split.append((choice, 5 - seed, seed))
                else:
                    check_one_version(choice, models[seed if spans[0][0] == str(version) else 5 - seed])
            if split:
                break
    finally:
        stop.set()
        pool.shutdown()
        await syncer.close()
    assert syncer._servers[shared_vllm.base_url].swap and split, "no swap landed inside a request"
    assert shared_vllm.get_json("/weight_info")["weight_version"] == str(version)
    assert vllm_greedy(shared_vllm, PROMPT) == greedy(models[seed], PROMPT)
    for choice, before_seed, after_seed in split:
        check_boundary(choice, models[before_seed], models[after_seed])


def check_one_version(choice: dict, model) -> None:
    """A request that ran under one version only: every token is that version's argmax."""
    ids = PROMPT + choice["token_ids"]
    by_model = teacher_forced_argmax(model, ids)
    assert choice["token_ids"] == by_model[len(PROMPT) - 1:-1]


def check_boundary(choice: dict, old, new) -> None:
    """Around the span boundary, each token is the argmax of the weights its span names (running
    requests were preempted and recomputed, so the KV behind the new tokens is new too)."""
    first, second = choice["weight_versions"]
    boundary, tokens = second["start"], choice["token_ids"]
    assert first["end"] == boundary and 0 < boundary < len(tokens) == 500
    ids, P = PROMPT + tokens, len(PROMPT)
    by_old, by_new = teacher_forced_argmax(old, ids), teacher_forced_argmax(new, ids)
    before = range(max(0, boundary - 8), boundary)
    after = range(boundary, min(len(tokens), boundary + 8))
    assert [tokens[j] for j in before] == [by_old[P + j - 1] for j in before]
    assert [tokens[j] for j in after] == [by_new[P + j - 1] for j in after]
    assert any(by_old[P + j - 1] != by_new[P + j - 1] for j in after)  # the two models do differ here


async def test_failed_swap_stays_paused_as_partial_and_the_next_sync_recovers(shared_vllm, tiny_model_factory):
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(str(tiny_model_factory(2)), dtype="float32").eval()
    transport = HttpTransport()
    syncer = WeightSyncer([shared_vllm.base_url], transport, 30.0, 60.0, load_mode="vllm", swap=True)
    await syncer.open()
    try:
        report = await syncer.sync(8, lambda: Prepared(8, [{"path": "/nonexistent/weights"}]))
        err = report.errors[shared_vllm.base_url]
        assert err.phase == "update" and "nonexistent" in err.detail
        assert shared_vllm.get_json("/weight_info")["weight_version"] == "partial"
        assert shared_vllm.get_json("/is_paused")["is_paused"] is True
        report = await syncer.sync(9, lambda: transport.prepare(named_weights(new), 9))
    finally:
        await syncer.close()
    assert report.ok and shared_vllm.get_json("/is_paused")["is_paused"] is False
    assert shared_vllm.get_json("/weight_info")["weight_version"] == "9"
    assert vllm_greedy(shared_vllm, PROMPT) == greedy(new, PROMPT)


def test_requests_go_on_after_a_swap_that_waited_for_the_step_in_flight(shared_vllm):
    """A swap sent while a request ends at every engine step pauses only once that step is
    done, so it runs in vLLM's idle callback, right before the engine's loop blocks on its
    input queue. With nothing else sent, the requests kept must still finish: before the
    plugin woke the loop, they waited for the next request to arrive (here: forever)."""
    label = shared_vllm.get_json("/weight_info")["weight_version"]
    spec = {"calls": [], "label": label, "reset_prefix_cache": True, "reset_running": True, "timeout": 30}
    pool = ThreadPoolExecutor(96)
    try:
        for _ in range(3):  # a slow poll of the gauge can come after they all ended: again
            # one ends per engine step
            requests = [pool.submit(long_greedy_request, shared_vllm, n, 90.0) for n in range(20, 116)]
            asyncio.run(running(shared_vllm, timeout=10.0))
            time.sleep(0.2)
            if not all(r.done() for r in requests):
                break
        assert not all(r.done() for r in requests), "the requests ended before the swap, three times"
        shared_vllm.post_json("/collective_rpc", {"method": "agrpo_swap", "args": [json.dumps(spec)], "timeout": 30})
        finished, stuck = wait(requests, timeout=60)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    assert not stuck, f"{len(stuck)} of {len(requests)} requests did not finish after the swap"
    assert sorted(len(r.result()["token_ids"]) for r in finished) == list(range(20, 116))
