"""VLLMClient against a small aiohttp stand-in for vLLM's HTTP surface (unit level)."""

import aiohttp
import pytest
from aiohttp import web

from agrpo.services.rollout.vllm_client import SamplingConfig, VLLMClient, VLLMError, VLLMIncompatible, parse_version


def make_app(version="0.32.0", dev=True, generate=True, seen=None):
    seen = seen if seen is not None else {}

    async def health(_):
        return web.Response(status=200)

    async def ver(_):
        return web.json_response({"version": version})

    async def is_paused(_):
        return web.json_response({"is_paused": False}) if dev else web.Response(status=404)

    async def models(_):
        return web.json_response({"data": [{"id": "m", "max_model_len": 300}]})

    async def gen(request):
        if not generate:
            return web.Response(status=403)
        body = await request.json()
        seen["generate"] = body
        n = body["sampling_params"].get("n", 1) - seen.get("short_by", 0)
        choices = [{"index": i, "token_ids": [5 + i, 6], "finish_reason": "length",
                    "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.5}]},
                    "weight_versions": [{"version": "2", "start": 0, "end": 2}]} for i in range(n)]
        return web.json_response({"choices": choices[::-1]})  # vLLM's order is not promised

    async def completions(request):
        seen["completions"] = await request.json()
        return web.json_response({"choices": [{"token_ids": [7], "finish_reason": "stop",
                                               "logprobs": {"token_logprobs": [-0.25]}}]})

    app = web.Application()
    app.add_routes([web.get("/health", health), web.get("/version", ver), web.get("/is_paused", is_paused),
                    web.get("/v1/models", models), web.post("/inference/v1/generate", gen),
                    web.post("/v1/completions", completions)])
    return app


async def serve(app):
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


SAMPLING = SamplingConfig(max_tokens=8, temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.1)


async def test_generate_route_sends_every_sampling_param_and_parses_spans():
    seen = {}
    runner, url = await serve(make_app(seen=seen))
    async with aiohttp.ClientSession() as s:
        c = VLLMClient(url, s, request_timeout=5)
        info = await c.handshake(5, "0.22.0")
        assert info.has_generate and info.max_model_len == 300 and info.model == "m"
        out = await c.generate([1, 2], SAMPLING, "r1")
        unsalted = seen["generate"]
        await c.generate([1, 2], SAMPLING, "r1b", cache_salt="v3")
    await runner.cleanup()
    assert "cache_salt" not in unsalted and seen["generate"]["cache_salt"] == "v3"
    assert out.token_ids == [5, 6] and out.logprobs == [-0.5, -1.5] and out.spans == [("2", 0, 2)]
    sp = unsalted["sampling_params"]
    assert sp == {"max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.1,
                  "repetition_penalty": 1.1, "n": 1, "logprobs": 0, "detokenize": False}
    assert unsalted["token_ids"] == [1, 2] and unsalted["request_id"] == "r1"


async def test_a_request_under_an_adapter_names_it_and_is_that_versions_alone():
    """Adapter-only LoRA sync: the model is the version's adapter, and every token is that
    version's whatever weight label the server reports (here "2")."""
    seen = {}
    runner, url = await serve(make_app(seen=seen))
    async with aiohttp.ClientSession() as s:
        c = VLLMClient(url, s, request_timeout=5)
        await c.handshake(5, "0.22.0")
        out = await c.generate([1, 2], SAMPLING, "r1", adapter="agrpo-v7")
    await runner.cleanup()
    assert seen["generate"]["model"] == "agrpo-v7"
    assert out.spans == [("7", 0, 2)]


async def test_a_whole_group_in_one_request_comes_back_in_index_order():
    seen = {}
    runner, url = await serve(make_app(seen=seen))
    async with aiohttp.ClientSession() as s:
        c = VLLMClient(url, s, request_timeout=5)
        await c.handshake(5, "0.22.0")
        outs = await c.generate_all([1, 2], SamplingConfig(max_tokens=8, n=3), "g1")
        seen["short_by"] = 1  # a server that answers with fewer completions than asked for
        with pytest.raises(VLLMIncompatible, match=r"answered 2 of the 3 completions .*one_request_per_group"):
            await c.generate_all([1, 2], SamplingConfig(max_tokens=8, n=3), "g2")
        with pytest.raises(VLLMError, match="an answer without a completion"):  # n = 1: not a config matter
            await c.generate([1, 2], SamplingConfig(max_tokens=8), "r3")
    await runner.cleanup()
    assert [o.token_ids for o in outs] == [[5, 6], [6, 6], [7, 6]]
    assert all(o.logprobs == [-0.5, -1.5] and o.spans == [("2", 0, 2)] and o.server == url for o in outs)


async def test_falls_back_to_completions_with_token_ids():
    seen = {}
    runner, url = await serve(make_app(generate=False, seen=seen))
    async with aiohttp.ClientSession() as s:
        c = VLLMClient(url, s, request_timeout=5)
        assert not (await c.handshake(5, "0.22.0")).has_generate
        out = await c.generate([3], SamplingConfig(max_tokens=4), "r2", cache_salt="v0")
    await runner.cleanup()
    assert seen["completions"]["cache_salt"] == "v0"
    assert out.token_ids == [7] and out.logprobs == [-0.25] and out.spans == []
    body = seen["completions"]
    assert body["prompt"] == [3] and body["return_token_ids"] is True and body["logprobs"] == 0
    assert body["max_tokens"] == 4 and body["top_k"] == -1 and "min_p" not in body


@pytest.mark.parametrize("kw,match", [({"version": "0.17.1"}, "needs >= 0.22.0"),
                                      ({"dev": False}, "dev mode")])
async def test_refuses_old_or_non_dev_servers(kw, match):
    runner, url = await serve(make_app(**kw))
    async with aiohttp.ClientSession() as s:
        with pytest.raises(VLLMIncompatible, match=match):
            await VLLMClient(url, s, request_timeout=5).handshake(5, "0.22.0")
    await runner.cleanup()


async def test_health_wait_times_out_and_errors_are_vllm_errors():
    async with aiohttp.ClientSession() as s:
        c = VLLMClient("http://127.0.0.1:9", s, request_timeout=1)
        with pytest.raises(TimeoutError, match="vllm_server_timeout"):
            await c.wait_healthy(0.3, poll_s=0.1)
        with pytest.raises(VLLMError):
            await c.generate([1], SamplingConfig(max_tokens=1), "x")


def test_parse_version():
    assert parse_version("0.32.0") == (0, 32, 0)
    assert parse_version("0.30.1.dev3+g12ab") == (0, 30, 1)
    assert parse_version("0.22.0") > parse_version("0.17.1")
