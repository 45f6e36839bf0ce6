"""Proto <-> Python shapes for reward requests.

Requests become what a TRL reward function expects: standard prompts/completions as
`str`, conversational ones as lists of `{"role", "content"}` dicts (plus `tool_calls`
and `name` when set), columns as plain JSON-like values. `google.protobuf.Value` has
only doubles, so an integral number comes back as `int`, as `json.loads` would give.
"""

from __future__ import annotations

from typing import Any, cast

from google.protobuf import struct_pb2

from agrpo.services.common.errors import InvalidArgument
from agrpo.v1 import reward_service_pb2 as reward_pb

from .registry import FunctionInfo
from .results import ItemScore, Status
from .scorer import ScoreBatch

_MAX_EXACT_INT = 2**53


def value_to_python(value: struct_pb2.Value) -> Any:
    """A protobuf Value as a plain Python value."""
    kind = value.WhichOneof("kind")
    if kind is None or kind == "null_value":
        return None
    if kind == "number_value":
        number = value.number_value
        if number.is_integer() and abs(number) <= _MAX_EXACT_INT:
            return int(number)
        return number
    if kind == "struct_value":
        return struct_to_python(value.struct_value)
    if kind == "list_value":
        return [value_to_python(v) for v in value.list_value.values]
    return getattr(value, kind)  # string_value, bool_value


def struct_to_python(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A protobuf Struct as a dict."""
    return {key: value_to_python(v) for key, v in struct.fields.items()}


def _message(msg: reward_pb.ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": msg.role, "content": msg.content}
    if msg.tool_calls:
        out["tool_calls"] = [struct_to_python(call) for call in msg.tool_calls]
    if msg.name:
        out["name"] = msg.name
    return out


def text_to_python(text: reward_pb.Text) -> str | list[dict[str, Any]] | None:
    """A Text as a string (standard) or a message list (conversational); None when unset."""
    form = text.WhichOneof("form")
    if form == "text":
        return text.text
    if form == "messages":
        return [_message(m) for m in text.messages.messages]
    return None


def batch_from_proto(request: reward_pb.ScoreRequest) -> ScoreBatch:
    """The request's items in TRL's shapes (InvalidArgument for an item without completion)."""
    batch = ScoreBatch([], [], [], [])
    for i, item in enumerate(request.items):
        completion = text_to_python(item.completion)
        if completion is None:
            raise InvalidArgument(f"items[{i}].completion: missing (set text or messages)")
        prompt = text_to_python(item.prompt)
        if prompt is None:  # external scorers may have no prompt; keep the completion's form
            prompt = "" if isinstance(completion, str) else []
        batch.prompts.append(prompt)
        batch.completions.append(completion)
        batch.completion_ids.append(list(item.completion_ids))
        batch.columns.append({key: value_to_python(v) for key, v in item.columns.items()})
    return batch


def refs_from_proto(request: reward_pb.ScoreRequest) -> list[tuple[str, float]]:
    """(name, weight) of each named function; weight 0 means the configured one."""
    return [(ref.name, ref.weight) for ref in request.functions]


def response_to_proto(request_id: str, items: list[ItemScore],
                      latency_ms: dict[str, float]) -> reward_pb.ScoreResponse:
    """The ScoreResponse for scored items."""
    out = reward_pb.ScoreResponse(request_id=request_id, function_latency_ms=latency_ms)
    for item in items:
        out.items.append(reward_pb.ItemScore(total=item.total, scores=[
            reward_pb.FunctionScore(name=s.name, status=cast(reward_pb.ScoreStatus, int(s.status)), weight=s.weight,
                                    value=s.value if s.status is Status.OK else 0.0,
                                    reason=s.reason)
            for s in item.scores]))
    return out


def info_to_proto(info: FunctionInfo) -> reward_pb.RewardFunctionInfo:
    """One ListRewardFunctions entry."""
    return reward_pb.RewardFunctionInfo(
        name=info.name, description=info.description, required_columns=info.required_columns,
        default_weight=info.weight, builtin=info.builtin, default_enabled=info.default_enabled,
        source=info.source)
