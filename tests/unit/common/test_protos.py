"""The contract: messages round-trip, and the generated code matches the protos."""

from __future__ import annotations

import filecmp
import math
from pathlib import Path

from google.protobuf import struct_pb2

from agrpo.v1 import common_pb2, reward_service_pb2, trainer_service_pb2

ROOT = Path(__file__).resolve().parents[3]


def test_rollout_sample_round_trip():
    sample = common_pb2.RolloutSample(
        sample_id="s-1", group_id="g-1", prompt_key=common_pb2.PromptKey(dataset_index=7, epoch=2),
        policy_version=3, version_spans=[common_pb2.VersionSpan(policy_version=3, start=4, end=6),
                                         common_pb2.VersionSpan(policy_version=4, start=6, end=8)],
        input_ids=[1, 2, 3, 4, 5, 6, 7, 8], completion_mask=[0, 0, 0, 0, 1, 1, 1, 1],
        behavior_logprobs=[0, 0, 0, 0, -0.5, -1.25, -2.0, -0.125], prompt_length=4,
        advantage=-1.0, reward=float("nan"), reward_components={"accuracy": 1.0},
        metrics={"reward_std": 0.5})
    back = common_pb2.RolloutSample.FromString(sample.SerializeToString())
    assert back == sample or math.isnan(back.reward)
    assert list(back.input_ids) == list(sample.input_ids)
    assert list(back.behavior_logprobs) == [0, 0, 0, 0, -0.5, -1.25, -2.0, -0.125]
    assert back.version_spans[1].policy_version == 4 and back.prompt_key.epoch == 2
    assert math.isnan(back.reward) and back.reward_components["accuracy"] == 1.0


def test_push_samples_messages_round_trip():
    req = trainer_service_pb2.PushSamplesRequest(
        hello=trainer_service_pb2.PushSamplesHello(producer_id="rollout-1", prompts_per_epoch=100))
    back = trainer_service_pb2.PushSamplesRequest.FromString(req.SerializeToString())
    assert back.WhichOneof("payload") == "hello" and back.hello.prompts_per_epoch == 100
    resp = trainer_service_pb2.PushSamplesResponse(
        credits=16, policy_version=2,
        acks=[trainer_service_pb2.SampleAck(sample_id="s", outcome=trainer_service_pb2.SAMPLE_OUTCOME_TRAINED)],
        resume_point=common_pb2.ResumePoint(step=5, trained=[common_pb2.PromptKey(dataset_index=1)]))
    assert trainer_service_pb2.PushSamplesResponse.FromString(resp.SerializeToString()) == resp


def test_score_request_round_trip_with_columns_and_messages():
    conv = reward_service_pb2.Conversation(messages=[reward_service_pb2.ChatMessage(role="user", content="2+2?")])
    item = reward_service_pb2.ScoreItem(
        prompt=reward_service_pb2.Text(messages=conv), completion=reward_service_pb2.Text(text="4"),
        completion_ids=[5, 6], columns={"solution": struct_pb2.Value(string_value="4")})
    req = reward_service_pb2.ScoreRequest(request_id="r", items=[item],
                                          functions=[reward_service_pb2.RewardFunctionRef(name="accuracy")])
    back = reward_service_pb2.ScoreRequest.FromString(req.SerializeToString())
    assert back == req and back.items[0].prompt.WhichOneof("form") == "messages"


def test_status_oneof_round_trip():
    resp = common_pb2.GetStatusResponse(
        service=common_pb2.ServiceInfo(service="trainer", state=common_pb2.SERVING_STATE_SERVING),
        trainer=common_pb2.TrainerStatus(step=3, samples_dropped={"stale": 2}))
    back = common_pb2.GetStatusResponse.FromString(resp.SerializeToString())
    assert back.WhichOneof("detail") == "trainer" and back.trainer.samples_dropped["stale"] == 2


def test_generated_code_matches_protos(tmp_path):
    from gen_protos import generate  # scripts/ is on pytest's pythonpath
    generate(tmp_path)
    committed = sorted(p.relative_to(ROOT) for p in (ROOT / "agrpo" / "v1").glob("*.py*"))
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert committed == fresh, "agrpo/v1/ and protos/ list different files: run scripts/gen_protos.py"
    drifted = [str(p) for p in fresh if not filecmp.cmp(tmp_path / p, ROOT / p, shallow=False)]
    assert not drifted, f"generated code drifted from protos/: {drifted}; run scripts/gen_protos.py"


def test_protos_pass_buf_lint():
    import shutil
    import subprocess

    import pytest

    buf = ROOT / ".cache" / "tools" / "node_modules" / ".bin" / "buf"
    buf = str(buf) if buf.exists() else shutil.which("buf")
    if not buf:
        pytest.skip("buf not installed (scripts/setup_env.sh tools installs it from npm)")
    proc = subprocess.run([buf, "lint"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
