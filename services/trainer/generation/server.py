"""The part of vLLM's HTTP API that rollout and the trainer's syncer use, served by the trainer.

Routes: /health, /version, /is_paused, /v1/models, /weight_info, /inference/v1/generate (token
ids in and out, processed logprobs, weight-version spans) and its abort routes. Anything else
answers 404, so a client that needs more of vLLM learns it at once.
"""

from __future__ import annotations

from aiohttp import web

from agrpo import __version__
from agrpo.services.common.logging import get_logger
from agrpo.services.common.vllm_api import TRAINER_ENGINE

from .generator import Generator, Request
from .sampling import SamplingParams

log = get_logger("trainer.generation")


def build_app(generator: Generator, model_name: str) -> web.Application:
    """The routes, answered from `generator`."""

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": __version__, "engine": TRAINER_ENGINE})

    async def is_paused(_: web.Request) -> web.Response:
        return web.json_response({"is_paused": False})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": model_name, "object": "model", "max_model_len": generator.max_model_len}]})

    async def weight_info(_: web.Request) -> web.Response:
        return web.json_response({"weight_version": generator.label})

    async def generate(request: web.Request) -> web.Response:
        try:
            body = await request.json()
            prompt = [int(t) for t in body["token_ids"]]
            params = SamplingParams.from_request(body.get("sampling_params") or {})
            if not prompt or len(prompt) >= generator.max_model_len:
                raise ValueError(f"token_ids: {len(prompt)} tokens; between 1 and {generator.max_model_len - 1}")
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        request_id = str(body.get("request_id") or id(body))
        choices = await generator.submit(Request(request_id, prompt, params))
        return web.json_response({"request_id": request_id, "choices": [
            {"index": i, "token_ids": c.token_ids, "finish_reason": c.finish_reason,
             "logprobs": {"content": [{"logprob": lp} for lp in c.logprobs]},
             "weight_versions": [{"version": v, "start": s, "end": e} for v, s, e in c.spans()]}
            for i, c in enumerate(choices)]})

    async def abort(request: web.Request) -> web.Response:
        try:
            ids = [str(r) for r in (await request.json()).get("request_ids", [])]
        except (ValueError, TypeError):
            return web.json_response({"error": "expected {\"request_ids\": [...]}"}, status=400)
        return web.json_response({"aborted": generator.abort(ids)})

    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes([web.get("/health", health), web.get("/version", version), web.get("/is_paused", is_paused),
                    web.get("/v1/models", models), web.get("/weight_info", weight_info),
                    web.post("/inference/v1/generate", generate),
                    web.post("/inference/v1/abort_requests", abort), web.post("/abort_requests", abort)])
    return app


async def start(generator: Generator, model_name: str, host: str, port: int) -> web.AppRunner:
    """Serve on host:port (the caller keeps the runner and cleans it up)."""
    runner = web.AppRunner(build_app(generator, model_name), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("the trainer serves generation at http://%s:%d (weight_transport local)", host, port)
    return runner
