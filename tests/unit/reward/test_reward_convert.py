"""Proto -> TRL shapes: texts, messages, columns."""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2

from agrpo.services.common.errors import InvalidArgument
from agrpo.services.reward import convert
from agrpo.v1 import reward_service_pb2 as pb


def test_values_become_plain_python():
    s = struct_pb2.Struct()
    s.update({"n": 3, "x": 2.5, "s": "t", "b": True, "none": None, "l": [1, "a"], "d": {"k": 1}})
    got = convert.struct_to_python(s)
    assert got == {"n": 3, "x": 2.5, "s": "t", "b": True, "none": None, "l": [1, "a"], "d": {"k": 1}}
    assert isinstance(got["n"], int) and isinstance(got["l"][0], int)


def test_batch_shapes():
    tool_call = struct_pb2.Struct()
    tool_call.update({"name": "f", "arguments": {"a": 1}})
    req = pb.ScoreRequest(items=[
        pb.ScoreItem(prompt=pb.Text(text="p"), completion=pb.Text(text="c"), completion_ids=[1, 2]),
        pb.ScoreItem(completion=pb.Text(messages=pb.Conversation(messages=[
            pb.ChatMessage(role="assistant", content="hi", tool_calls=[tool_call]),
            pb.ChatMessage(role="tool", content="out", name="f")]))),
    ])
    batch = convert.batch_from_proto(req)
    assert batch.prompts == ["p", []] and batch.completion_ids == [[1, 2], []]
    assert batch.completions[0] == "c"
    assert batch.completions[1] == [
        {"role": "assistant", "content": "hi", "tool_calls": [{"name": "f", "arguments": {"a": 1}}]},
        {"role": "tool", "content": "out", "name": "f"}]
    with pytest.raises(InvalidArgument, match=r"items\[0\].completion"):
        convert.batch_from_proto(pb.ScoreRequest(items=[pb.ScoreItem()]))
