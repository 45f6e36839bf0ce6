"""The reward service against a real in-process gRPC server (port 0) and real workers."""

from __future__ import annotations

import asyncio
import math
import os
import signal
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from prometheus_client import generate_latest

from agrpo.v1 import reward_service_pb2 as pb
from reward_helpers import FAILED, NA, OK, TIMEOUT, client, column, item, make_cfg, request, running, values

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

U = "reward_user_funcs"
FUNCS = [
    {"name": "accuracy"},
    {"name": "think_format", "weight": 0.5},
    {"name": "cosine_scaled", "kwargs": {"max_len": 100}},
    {"name": "soft_overlong_punishment", "kwargs": {"max_completion_len": 100, "soft_punish_cache": 20}},
    {"name": "repetition_penalty", "kwargs": {"ngram_size": 2}},
    {"name": "accuracy", "alias": "accuracy_quick", "kwargs": {"item_timeout_s": 1}},
    *({"name": f"{U}:{n}"} for n in (
        "reward_len", "format_reward", "async_len", "column_echo", "math_only", "shape_probe",
        "main_thread_probe", "raises", "sleeps", "non_finite", "wrong_length", "returns_none",
        "exits", "pid_then_sleep", "huge_values")),
    {"name": f"{U}:scaled", "kwargs": {"factor": 2.0}},
    {"name": f"{U}:ColumnEcho", "alias": "echo_alias"},
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    async with running(make_cfg(FUNCS, call_timeout_s=6.0, max_items=8)) as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="module")
async def stub(server):
    async with client(server.port) as s:
        yield s


def metric(server, text: str) -> float:
    """Value of the first sample line starting with `text` in the server's metrics."""
    for line in generate_latest(server.app.metrics.registry).decode().splitlines():
        if line.startswith(text):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_lists_functions_with_trl_names(stub):
    listed = {f.name: f for f in (await stub.ListRewardFunctions(pb.ListRewardFunctionsRequest())).functions}
    assert listed["accuracy_reward"].required_columns == ["solution"]
    assert listed["accuracy_reward"].builtin and listed["accuracy_reward"].default_enabled
    assert listed["think_format_reward"].default_weight == 0.5
    assert listed["scaled"].source == f"{U}:scaled"  # partial unwrapped
    assert listed["ColumnEcho"].required_columns == ["score"]  # class instance -> class name
    assert "echo_alias" in listed and "reasoning_accuracy_reward" in listed
    assert not listed["reasoning_accuracy_reward"].default_enabled  # offered, not configured


async def test_accuracy_trl_example_and_latex(stub):
    sol = r"\frac{1}{3}"
    items = [item([{"role": "assistant", "content": r"My answer is \boxed{\frac{1}{3}}"}], solution=sol),
             item([{"role": "assistant", "content": r"My answer is \boxed{\frac{1}{2}}"}], solution=sol),
             item(r"so $x = \frac{2}{6}$, i.e. \boxed{\dfrac{1}{3}}", solution=sol),
             item("Natalia sold 48 + 24 = 72 clips. \\boxed{72}", solution="72"),
             item("anything", solution="not math at all")]
    resp = await stub.Score(request(items, "accuracy_reward"))
    assert values(resp, "accuracy_reward")[:4] == [1.0, 0.0, 1.0, 1.0]
    assert column(resp, "accuracy_reward")[4][0] == NA  # unparseable gold -> None
    assert math.isnan(resp.items[4].total)


async def test_accuracy_timeouts_work_in_workers(stub):
    # Hangs math-verify without a (signal-based) timeout; here it costs ~1 s and is TIMEOUT,
    # not a silent 0.0 that reads as a wrong answer.
    items = [item(r"\boxed{9^{9^{9^{9}}}}", solution="2")]
    resp = await stub.Score(request(items, "accuracy_quick", "main_thread_probe"))
    assert [s for s, _ in column(resp, "accuracy_quick")] == [TIMEOUT]
    assert "1s" in resp.items[0].scores[0].reason
    assert values(resp, "main_thread_probe") == [1.0]


async def test_latex_bombs_cost_their_own_items_only(stub):
    # C3: two bombs among 8 items took math-verify 5 s each, past call_timeout_s (6 s
    # here), and all 8 came back TIMEOUT. Now each item has its limit and its share.
    bombs = {2: r"\boxed{9^{9^{9^{9}}}}", 5: r"\boxed{10^{10^{10}}}"}
    items = [item(bombs.get(i, rf"so \boxed{{{i}}}"), solution=str(i if i % 2 else i + 1))
             for i in range(8)]
    resp = await stub.Score(request(items, "accuracy_reward"))
    statuses = [s for s, _ in column(resp, "accuracy_reward")]
    assert [statuses[i] for i in bombs] == [TIMEOUT, TIMEOUT]
    # The six others are scored: odd i answers its solution, even i does not.
    assert [v for i, v in enumerate(values(resp, "accuracy_reward")) if i not in bombs] == \
        [0.0, 1.0, 1.0, 0.0, 0.0, 1.0]


async def test_other_builtins_on_trl_examples(stub):
    think = [item("<think>\nThis is my reasoning.\n</think>\nThis is my answer.", ids=[1, 2, 3, 4]),
             item("<think>\nThis is my reasoning.\nThis is my answer.", ids=[5, 5, 5, 5, 5])]
    resp = await stub.Score(request(think, "think_format_reward", "repetition_penalty_reward"))
    assert values(resp, "think_format_reward") == [1.0, 0.0]
    assert values(resp, "repetition_penalty_reward") == [0.0, -0.75]

    sol = r"\frac{1}{3}"
    cos = [item(r"\boxed{\frac{1}{3}}", ids=[1] * 50, solution=sol),
           item(r"\boxed{\frac{1}{2}}", ids=[1] * 50, solution=sol)]
    resp = await stub.Score(request(cos, "cosine_scaled_reward"))
    assert values(resp, "cosine_scaled_reward") == pytest.approx([0.75, -0.75])

    lengths = [item("x", ids=[1] * n) for n in (80, 90, 100, 101)]
    resp = await stub.Score(request(lengths, "soft_overlong_punishment_reward"))
    assert values(resp, "soft_overlong_punishment_reward") == pytest.approx([0.0, -0.5, -1.0, -1.0])

    reasoning = [item(r"<think> r </think> The final answer is \boxed{\frac{1}{3}}", solution=sol),
                 item(r"<think> r </think> The final answer is \boxed{\frac{1}{2}}", solution=sol),
                 item(r"<think> partial \boxed{\frac{1}{3}} but no final answer", solution=sol)]
    resp = await stub.Score(request(reasoning, "reasoning_accuracy"))  # short name works too
    assert values(resp, "reasoning_accuracy_reward") == [1.0, 0.0, 0.0]


async def test_trl_user_functions_unchanged(stub):
    conv = [item([{"role": "assistant", "content": "<think>a</think><answer>b</answer>"}],
                 prompt=[{"role": "user", "content": "q"}], ids=[1, 2], meta={"n": 3}),
            item([{"role": "assistant", "content": "x" * 20}],
                 prompt=[{"role": "user", "content": "q"}], ids=[3], meta={"n": 4})]
    resp = await stub.Score(request(conv, "reward_len", "format_reward", "shape_probe"))
    assert values(resp, "reward_len") == [-14.0, 0.0]
    assert values(resp, "format_reward") == [1.0, 0.0]
    assert values(resp, "shape_probe") == [1.0, 1.0]

    std = [item("abc", prompt="p", ids=[7], score=0.25, meta={"n": 1}),
           item("abcd", prompt="p", ids=[8], score=2, meta={"n": 2})]
    resp = await stub.Score(request(std, "async_len", "ColumnEcho", "echo_alias", "scaled",
                                    "shape_probe"))
    assert values(resp, "async_len") == [3.0, 4.0]
    assert values(resp, "ColumnEcho") == values(resp, "echo_alias") == [0.25, 2.0]
    assert values(resp, "scaled") == [6.0, 8.0]
    assert values(resp, "shape_probe") == [1.0, 1.0]
    assert set(resp.function_latency_ms) == {"async_len", "ColumnEcho", "echo_alias", "scaled",
                                             "shape_probe"}


async def test_none_and_weights(stub):
    items = [item("aa", kind="math", score=1.0), item("bbb", kind="code", score=3.0),
             item("c", kind="code", score=math.nan)]
    resp = await stub.Score(request(items, ("math_only", 2.0), ("ColumnEcho", 0.5)))
    assert column(resp, "math_only")[1][0] == NA
    assert column(resp, "ColumnEcho")[2][0] == FAILED  # NaN is a failure, not a score
    assert [it.total for it in resp.items[:2]] == [2.0 * 1.0 + 0.5 * 1.0, 0.5 * 3.0]
    assert math.isnan(resp.items[2].total)  # nothing OK -> NaN
    assert [s.weight for s in resp.items[0].scores] == [2.0, 0.5]
    # Weight 0 means the configured weight.
    resp = await stub.Score(request([item("<think>x</think>y")], ("think_format_reward", 0.0)))
    assert resp.items[0].scores[0].weight == 0.5 and resp.items[0].total == 0.5


async def test_failures_are_per_function(server, stub):
    before = metric(server, 'agrpo_reward_function_failures_total{function="raises"}')
    items = [item("a"), item("bb"), item("ccc")]
    resp = await stub.Score(request(items, "raises", "non_finite", "wrong_length", "returns_none",
                                    "exits", "async_len"))
    assert all(s == FAILED for s, _ in column(resp, "raises"))
    assert "RuntimeError: boom" in resp.items[0].scores[0].reason
    assert [s for s, _ in column(resp, "non_finite")] == [FAILED, FAILED, OK]
    assert all(s == FAILED for s, _ in column(resp, "wrong_length"))
    assert "4 values for 3 items" in resp.items[0].scores[2].reason
    assert all(s == FAILED for s, _ in column(resp, "returns_none"))
    assert all(s == FAILED for s, _ in column(resp, "exits"))
    assert values(resp, "async_len") == [1.0, 2.0, 3.0]
    assert [it.total for it in resp.items] == [1.0, 2.0, 4.0]  # only OK scores count
    assert metric(server, 'agrpo_reward_function_failures_total{function="raises"}') == before + 3


async def test_hung_function_times_out_and_worker_is_replaced(server, stub):
    resp = await stub.Score(request([item("a"), item("b")], "sleeps", "async_len"))
    assert [s for s, _ in column(resp, "sleeps")] == [TIMEOUT, TIMEOUT]
    assert "6s" in resp.items[0].scores[0].reason
    assert values(resp, "async_len") == [1.0, 1.0]
    assert metric(server, 'agrpo_reward_function_timeouts_total{function="sleeps"}') >= 1
    for _ in range(3):  # both workers still serve (the killed one was replaced)
        resp = await stub.Score(request([item("abc")], "async_len", "scaled"))
        assert values(resp, "scaled") == [6.0]
    assert metric(server, 'agrpo_reward_worker_restarts_total{cause="timeout"}') >= 1


async def test_sigkilled_worker_fails_the_call_and_is_replaced(server, stub, tmp_path: Path):
    pid_file = tmp_path / "pid"
    call = asyncio.ensure_future(stub.Score(request([item("a", pid_file=str(pid_file))],
                                                    "pid_then_sleep")))
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.05)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    resp = await call
    score = resp.items[0].scores[0]
    assert score.status == FAILED and "died" in score.reason and "-9" in score.reason
    for _ in range(3):
        resp = await stub.Score(request([item("abcd")], "async_len"))
        assert values(resp, "async_len") == [4.0]


async def test_bad_input_codes(stub):
    async def code_of(req) -> grpc.StatusCode:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Score(req)
        return info.value.code()

    inv = grpc.StatusCode.INVALID_ARGUMENT
    assert await code_of(request([], "async_len")) == inv
    assert await code_of(request([item("a")] * 9, "async_len")) == inv  # max_items=8
    assert await code_of(request([item("a")], "no_such_function")) == grpc.StatusCode.NOT_FOUND
    assert await code_of(request([item("a")], "accuracy_reward")) == inv  # no `solution`
    assert await code_of(request([item("a", solution="1"), item("b")], "async_len")) == inv
    assert await code_of(request([item("a")], "async_len", "async_len")) == inv
    assert await code_of(request([item("a", prompts="x")], "async_len")) == inv  # reserved
    assert await code_of(request([pb.ScoreItem(prompt=pb.Text(text="p"))], "async_len")) == inv
    assert await code_of(request([item("a")], ("async_len", math.inf))) == inv


async def test_invalid_utf8_is_invalid_argument(server):
    # Protobuf clients refuse to encode bad UTF-8, so send raw bytes through a generic stub:
    # ScoreRequest{request_id (field 1) = b"\xff\xfe"}.
    raw = b"\x0a\x02\xff\xfe"
    async with grpc.aio.insecure_channel(f"localhost:{server.port}") as channel:
        call = channel.unary_unary("/agrpo.v1.RewardService/Score",
                                   request_serializer=lambda b: b,
                                   response_deserializer=pb.ScoreResponse.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(raw, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-8" in info.value.details()


async def test_score_stream_reports_undecodable_messages(server):
    # ScoreStreamRequest{request: ScoreRequest{request_id: b"\xff\xfe"}} as raw bytes.
    raw = b"\x0a\x04\x0a\x02\xff\xfe"
    async with grpc.aio.insecure_channel(f"localhost:{server.port}") as channel:
        call = channel.stream_stream("/agrpo.v1.RewardService/ScoreStream",
                                     request_serializer=lambda b: b,
                                     response_deserializer=pb.ScoreStreamResponse.FromString)
        responses = [r async for r in call(iter([raw]), timeout=30)]
    assert [r.code for r in responses] == [grpc.StatusCode.INVALID_ARGUMENT.value[0]]


async def test_score_stream_answers_each_request(stub):
    reqs = [request([item("ab")], "async_len", request_id="one"),
            request([item("a")], "no_such_function", request_id="two"),
            request([item("abc")], "scaled", request_id="three")]

    async def gen():
        for r in reqs:
            yield pb.ScoreStreamRequest(request=r)

    got = {r.response.request_id: r async for r in stub.ScoreStream(gen())}
    assert set(got) == {"one", "two", "three"}
    assert got["one"].code == 0 and values(got["one"].response, "async_len") == [2.0]
    assert got["two"].code == grpc.StatusCode.NOT_FOUND.value[0] and got["two"].error
    assert values(got["three"].response, "scaled") == [6.0]


async def test_metrics_are_exported(server, stub):
    await stub.Score(request([item("a")], "async_len"))
    text = generate_latest(server.app.metrics.registry).decode()
    for name in ("agrpo_reward_requests_total", "agrpo_reward_function_latency_seconds_bucket",
                 "agrpo_reward_queue_depth", "agrpo_reward_in_flight_requests",
                 "agrpo_reward_function_failures_total", "agrpo_reward_function_timeouts_total"):
        assert name in text
    assert metric(server, 'agrpo_reward_requests_total{code="OK",method="Score"}') >= 1


async def test_huge_finite_weights_and_values_are_not_internal(stub):
    # C1: weights of 1e308 on two functions overflowed math.fsum -> INTERNAL (13 in a stream).
    req = request([item("<think>a</think>\\boxed{4}", solution="4")],
                  ("accuracy_reward", 1e308), ("think_format_reward", 1e308))
    resp = await stub.Score(req)
    assert column(resp, "accuracy_reward") == [(OK, 1.0)] == column(resp, "think_format_reward")
    assert resp.items[0].total == math.inf

    async def gen():
        yield pb.ScoreStreamRequest(request=req)

    (answer,) = [r async for r in stub.ScoreStream(gen())]
    assert answer.code == 0 and answer.response.items[0].total == math.inf

    resp = await stub.Score(request([item("a"), item("b"), item("c")], ("huge_values", 10.0)))
    assert [s for s, _ in column(resp, "huge_values")] == [OK, FAILED, OK]  # 10**400: no float
    totals = [it.total for it in resp.items]
    assert totals[0] == math.inf and math.isnan(totals[1]) and totals[2] == -math.inf


async def test_error_messages_echo_bounded_input(stub):
    # C2: a 100,000-character name or 3,000 long column names made the trailer exceed
    # 16 KiB, and this (C-core) client then saw RESOURCE_EXHAUSTED instead of the code.
    async def error_of(req) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Score(req)
        return info.value

    err = await error_of(request([item("a")], "x" * 100_000))
    assert err.code() == grpc.StatusCode.NOT_FOUND and len(err.details()) < 1024
    err = await error_of(request([item("a")], "\u00e9\u4e2d" * 20_000))
    assert err.code() == grpc.StatusCode.NOT_FOUND and len(err.details().encode()) < 1024
    names = {f"column_{i:04d}_" + "y" * 40: 1 for i in range(3000)}
    mismatched = {f"other_{i:04d}_" + "z" * 40: 1 for i in range(3000)}
    err = await error_of(request([item("a", **names), item("b", **mismatched)], "async_len"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and len(err.details()) < 2048
    err = await error_of(request([item("a", **names)], "accuracy_reward"))  # no `solution`
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and len(err.details()) < 2048
