"""Scorer against a fake RewardService on a real port (unit level): request shape,
NaN for non-OK functions, retry on UNAVAILABLE, failure after retries."""

import math

import grpc
import pytest

from agrpo.services.rollout.scoring import Scorer, ScoringFailed, build_request
from agrpo.v1 import reward_service_pb2 as reward_pb
from agrpo.v1 import reward_service_pb2_grpc as reward_grpc


class FakeReward(reward_grpc.RewardServiceServicer):
    def __init__(self, fail_times=0):
        self.fail_times = fail_times
        self.requests = []

    async def Score(self, request, context):
        self.requests.append(request)
        if self.fail_times > 0:
            self.fail_times -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        items = []
        for i, _ in enumerate(request.items):
            items.append(reward_pb.ItemScore(total=float(i), scores=[
                reward_pb.FunctionScore(name="f", status=reward_pb.SCORE_STATUS_OK, value=float(i), weight=1),
                reward_pb.FunctionScore(name="g", status=reward_pb.SCORE_STATUS_NOT_APPLICABLE)]))
        return reward_pb.ScoreResponse(request_id=request.request_id, items=items,
                                       function_latency_ms={"f": 2.0})


async def _serve(servicer):
    server = grpc.aio.server()
    reward_grpc.add_RewardServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, grpc.aio.insecure_channel(f"127.0.0.1:{port}")


def test_build_request_carries_text_messages_ids_and_columns():
    req = build_request("g1", [{"role": "user", "content": "hi"}],
                        [[{"role": "assistant", "content": "a"}], [{"role": "assistant", "content": "b"}]],
                        [[1, 2], [3]], {"solution": "4", "meta": {"k": [1, 2]}})
    assert req.request_id == "g1" and len(req.items) == 2
    item = req.items[1]
    assert item.prompt.messages.messages[0].content == "hi"
    assert item.completion.messages.messages[0].content == "b" and list(item.completion_ids) == [3]
    assert item.columns["solution"].string_value == "4"
    assert item.columns["meta"].struct_value["k"][1] == 2
    plain = build_request("g2", "What?", ["x"], [[9]], {})
    assert plain.items[0].prompt.text == "What?" and plain.items[0].completion.text == "x"


async def test_scores_and_nan_for_non_ok():
    server, ch = await _serve(FakeReward())
    scores = await Scorer(ch, deadline_s=5, retries=0).score(build_request("g", "p", ["a", "b"], [[1], [2]], {}))
    await server.stop(0)
    assert scores.totals == [0.0, 1.0] and scores.components["f"] == [0.0, 1.0]
    assert all(math.isnan(v) for v in scores.components["g"])


async def test_retries_unavailable_then_gives_up():
    fake = FakeReward(fail_times=2)
    server, ch = await _serve(fake)
    scorer = Scorer(ch, deadline_s=5, retries=2, backoff_s=0.01)
    assert (await scorer.score(build_request("g", "p", ["a"], [[1]], {}))).totals == [0.0]
    fake.fail_times = 10
    with pytest.raises(ScoringFailed, match="UNAVAILABLE"):
        await scorer.score(build_request("g", "p", ["a"], [[1]], {}))
    await server.stop(0)
