"""Defaults, overload, start-up failures, health and reflection of the reward server."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agrpo.services.reward.pool import WorkerStartError
from agrpo.v1 import reward_service_pb2 as pb
from reward_helpers import SERVICE, client, item, make_cfg, request, running, values

pytestmark = pytest.mark.timeout(120)
U = "reward_user_funcs"


async def test_request_without_functions_uses_configured_defaults():
    funcs = [{"name": "think_format", "weight": 2.0}, {"name": f"{U}:async_len"}]
    cfg = make_cfg(funcs, num_workers=1, top={"reward_weights": [3.0, 0.5]})
    async with running(cfg) as srv, client(srv.port) as stub:
        resp = await stub.Score(pb.ScoreRequest(items=[pb.ScoreItem(
            completion=pb.Text(text="<think>a</think>b"))]))
        scores = resp.items[0].scores
        assert [s.name for s in scores] == ["think_format_reward", "async_len"]
        assert [s.weight for s in scores] == [3.0, 0.5]  # reward_weights override weight
        assert resp.items[0].total == 3.0 * 1.0 + 0.5 * 17
        # Offered (not configured) built-ins are only used when named.
        resp = await stub.Score(request([item("a", solution="1")], "accuracy_reward"))
        assert values(resp, "accuracy_reward") == [0.0]


async def test_spawn_start_method_works():
    cfg = make_cfg([{"name": f"{U}:async_len"}], num_workers=1, start_method="spawn")
    async with running(cfg) as srv, client(srv.port) as stub:
        resp = await stub.Score(request([item("abc")], "async_len"))
        assert values(resp, "async_len") == [3.0]


async def test_no_defaults_configured_is_invalid_argument():
    async with running(make_cfg([], num_workers=1)) as srv, client(srv.port) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Score(pb.ScoreRequest(items=[item("a")]))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_overload_is_refused_at_once_and_the_service_recovers():
    cfg = make_cfg([{"name": f"{U}:nap"}], num_workers=1, max_queue=1)
    async with running(cfg) as srv, client(srv.port) as stub:
        first = asyncio.ensure_future(stub.Score(request([item("a")], "nap")))
        second = asyncio.ensure_future(stub.Score(request([item("b")], "nap")))
        await asyncio.sleep(0.5)  # both admitted: one running, one waiting
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Score(request([item("c")], "nap"))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # C8: admission comes before parsing: bytes that do not even parse are refused
        # for capacity (not INVALID_ARGUMENT), so a refusal costs no parse or conversion.
        assert await _raw_score_code(srv.port, b"\x0a\x02\xff\xfe") == \
            grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len((await first).items) == 1 and len((await second).items) == 1
        resp = await stub.Score(request([item("d")], "nap"))  # capacity is back
        assert not math.isnan(resp.items[0].total)

        # A stream beyond capacity is slowed down (flow control), not refused.
        async def gen():
            for i in range(4):
                yield pb.ScoreStreamRequest(request=request([item("e")], "nap", request_id=str(i)))

        got = [r async for r in stub.ScoreStream(gen())]
        assert sorted(r.response.request_id for r in got) == ["0", "1", "2", "3"]
        assert [r.code for r in got] == [0, 0, 0, 0]


async def _raw_score_code(port: int, raw: bytes) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"localhost:{port}") as channel:
        call = channel.unary_unary("/agrpo.v1.RewardService/Score",
                                   request_serializer=lambda b: b,
                                   response_deserializer=pb.ScoreResponse.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(raw, timeout=30)
    return info.value.code()


async def test_request_that_cannot_meet_its_deadline_is_refused_at_once():
    # C8: at the measured pace (one worker, 1.5 s a request) a request admitted behind
    # one running and one waiting would take ~4.5 s: with 2 s left it is refused now,
    # rather than queued, half scored and cancelled.
    cfg = make_cfg([{"name": f"{U}:nap"}], num_workers=1, max_queue=8)
    async with running(cfg) as srv, client(srv.port) as stub:
        await stub.Score(request([item("a")], "nap"))  # measures the pace
        busy = [asyncio.ensure_future(stub.Score(request([item(c)], "nap"))) for c in "bc"]
        await asyncio.sleep(0.3)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Score(request([item("d")], "nap"), timeout=2.0)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        resp = await stub.Score(request([item("e")], "nap"), timeout=30.0)  # can make it
        assert [len(r.items) for r in await asyncio.gather(*busy)] == [1, 1]
        assert len(resp.items) == 1


async def test_concurrent_streams_beyond_capacity_are_slowed_not_refused():
    # C7: each stream kept up to the global capacity in flight, so two streams got code
    # 8 for what did not fit. Now a stream waits for a slot before reading on.
    cfg = make_cfg([{"name": f"{U}:nap_short"}], num_workers=1, max_queue=1)
    async with running(cfg) as srv, client(srv.port) as stub:
        async def stream(tag: str) -> list[pb.ScoreStreamResponse]:
            async def gen():
                for i in range(20):
                    yield pb.ScoreStreamRequest(
                        request=request([item("e")], "nap_short", request_id=f"{tag}{i}"))
            return [r async for r in stub.ScoreStream(gen())]

        got = await asyncio.gather(stream("a"), stream("b"))
        for tag, answers in zip("ab", got):
            assert sorted(r.response.request_id for r in answers) == sorted(
                f"{tag}{i}" for i in range(20))
            assert {r.code for r in answers} == {0}


async def test_oversized_message_is_refused():
    cfg = make_cfg([{"name": f"{U}:nap"}], num_workers=1, max_message_mb=1)
    async with running(cfg) as srv, client(srv.port, max_message_mb=8) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Score(request([item("x" * (2 * 1024 * 1024))], "nap"))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_unloadable_function_fails_the_start():
    server_cfg = make_cfg([{"name": "no_such_module_xyz:fn"}], num_workers=1)
    with pytest.raises(WorkerStartError, match="no_such_module_xyz"):
        async with running(server_cfg):
            pass
    with pytest.raises(WorkerStartError, match="max_len"):
        async with running(make_cfg([{"name": "cosine_scaled", "kwargs": {"max_len": -1}}])):
            pass


async def test_health_serving_and_reflection_lists_the_service():
    async with running(make_cfg([{"name": "think_format"}], num_workers=1)) as srv:
        async with grpc.aio.insecure_channel(f"localhost:{srv.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", SERVICE):
                resp = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
        names = await asyncio.to_thread(_reflected_services, srv.port)
        assert SERVICE in names


def _reflected_services(port: int) -> list[str]:
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(f"localhost:{port}") as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = list(db.get_services())
        # The contract is fully resolvable: what grpcurl needs to build requests.
        assert db.FindFileContainingSymbol(SERVICE).name == "agrpo/v1/reward_service.proto"
        return services
