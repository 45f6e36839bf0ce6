"""Balancer routing and failure handling with fake clients (unit level)."""

import asyncio

import pytest

from agrpo.services.rollout.balancer import Balancer, GenerationFailed
from agrpo.services.rollout.vllm_client import Completion, SamplingConfig, VLLMError


class FakeClient:
    def __init__(self, url, fail=False, delay=0.0, refuse=()):
        self.base_url = url
        self.fail = fail
        self.delay = delay
        self.refuse = set(refuse)  # prompts answered with HTTP 400
        self.calls = 0
        self.healthy_now = True

    async def generate_all(self, prompt_ids, sampling, request_id, cache_salt=None, adapter=""):
        self.calls += 1
        await asyncio.sleep(self.delay)
        if prompt_ids[0] in self.refuse:
            raise VLLMError(f"{self.base_url}: 400 Out of range float values are not JSON compliant: nan", 400)
        if self.fail:
            raise VLLMError(f"{self.base_url} down")
        return [Completion([1], [-0.1], "stop", latency_s=self.delay) for _ in range(sampling.n)]

    async def healthy(self):
        return self.healthy_now

    async def abort(self, ids):
        pass


S = SamplingConfig(max_tokens=1)


async def test_spreads_by_least_outstanding():
    a, b = FakeClient("a", delay=0.05), FakeClient("b", delay=0.05)
    bal = Balancer([a, b])
    await asyncio.gather(*(bal.generate([0], S, f"r{i}") for i in range(10)))
    assert a.calls == 5 and b.calls == 5


async def test_failed_server_is_marked_down_and_request_retried_elsewhere():
    bad, good = FakeClient("bad", fail=True), FakeClient("good")
    bad.healthy_now = False
    bal = Balancer([bad, good], retries=3, backoff_s=0.05)
    outs = [await bal.generate([0], S, f"r{i}") for i in range(5)]
    assert all(o.token_ids == [1] for o in outs)
    assert bad.calls == 1 and good.calls == 5
    assert not bal.servers[0].up and bal.servers[0].failures == 1
    bad.fail, bad.healthy_now = False, True  # it comes back
    for _ in range(50):
        if bal.servers[0].up:
            break
        await asyncio.sleep(0.02)
    assert bal.servers[0].up
    await bal.close()


async def test_request_fails_after_retries_when_every_server_fails():
    a = FakeClient("a", fail=True)
    bal = Balancer([a], retries=2, backoff_s=0.01)
    a.healthy_now = True  # probes succeed, requests keep failing
    with pytest.raises(GenerationFailed) as failed:
        await bal.generate([0], S, "r")
    assert a.calls == 2 and not failed.value.refused  # an outage: the prompt is not to blame
    await bal.close()


async def test_a_refused_request_fails_alone_and_the_server_stays_up():
    a = FakeClient("a", refuse={7})
    bal = Balancer([a], retries=3, backoff_s=0.01)
    with pytest.raises(GenerationFailed, match="400") as failed:
        await bal.generate([7], S, "bad")
    assert failed.value.refused
    assert bal.servers[0].up and bal.servers[0].failures == 0 and a.calls == 3
    assert (await bal.generate([0], S, "good")).token_ids == [1]  # the others go on at once
    await bal.close()


@pytest.mark.parametrize("status,refused", [(400, True), (404, True), (408, False), (429, False),
                                            (500, False), (503, False), (None, False)])
def test_which_errors_say_nothing_about_the_server(status, refused):
    assert VLLMError("x", status).request_refused is refused
