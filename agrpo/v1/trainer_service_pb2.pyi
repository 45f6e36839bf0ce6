from agrpo.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SampleOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SAMPLE_OUTCOME_UNSPECIFIED: _ClassVar[SampleOutcome]
    SAMPLE_OUTCOME_ACCEPTED: _ClassVar[SampleOutcome]
    SAMPLE_OUTCOME_TRAINED: _ClassVar[SampleOutcome]
    SAMPLE_OUTCOME_DUPLICATE: _ClassVar[SampleOutcome]
    SAMPLE_OUTCOME_DROPPED_STALE: _ClassVar[SampleOutcome]
    SAMPLE_OUTCOME_REJECTED: _ClassVar[SampleOutcome]
SAMPLE_OUTCOME_UNSPECIFIED: SampleOutcome
SAMPLE_OUTCOME_ACCEPTED: SampleOutcome
SAMPLE_OUTCOME_TRAINED: SampleOutcome
SAMPLE_OUTCOME_DUPLICATE: SampleOutcome
SAMPLE_OUTCOME_DROPPED_STALE: SampleOutcome
SAMPLE_OUTCOME_REJECTED: SampleOutcome

class PushSamplesHello(_message.Message):
    __slots__ = ("producer_id", "prompts_per_epoch")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_PER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    prompts_per_epoch: int
    def __init__(self, producer_id: _Optional[str] = ..., prompts_per_epoch: _Optional[int] = ...) -> None: ...

class PushSamplesRequest(_message.Message):
    __slots__ = ("hello", "sample", "heartbeat")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    hello: PushSamplesHello
    sample: _common_pb2.RolloutSample
    heartbeat: _common_pb2.HeartbeatRequest
    def __init__(self, hello: _Optional[_Union[PushSamplesHello, _Mapping]] = ..., sample: _Optional[_Union[_common_pb2.RolloutSample, _Mapping]] = ..., heartbeat: _Optional[_Union[_common_pb2.HeartbeatRequest, _Mapping]] = ...) -> None: ...

class SampleAck(_message.Message):
    __slots__ = ("sample_id", "outcome", "reason", "prompt_key")
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_KEY_FIELD_NUMBER: _ClassVar[int]
    sample_id: str
    outcome: SampleOutcome
    reason: str
    prompt_key: _common_pb2.PromptKey
    def __init__(self, sample_id: _Optional[str] = ..., outcome: _Optional[_Union[SampleOutcome, str]] = ..., reason: _Optional[str] = ..., prompt_key: _Optional[_Union[_common_pb2.PromptKey, _Mapping]] = ...) -> None: ...

class PushSamplesResponse(_message.Message):
    __slots__ = ("acks", "credits", "policy_version", "resume_point", "done", "lora_adapter")
    ACKS_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESUME_POINT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[SampleAck]
    credits: int
    policy_version: int
    resume_point: _common_pb2.ResumePoint
    done: bool
    lora_adapter: str
    def __init__(self, acks: _Optional[_Iterable[_Union[SampleAck, _Mapping]]] = ..., credits: _Optional[int] = ..., policy_version: _Optional[int] = ..., resume_point: _Optional[_Union[_common_pb2.ResumePoint, _Mapping]] = ..., done: _Optional[bool] = ..., lora_adapter: _Optional[str] = ...) -> None: ...

class WatchPolicyRequest(_message.Message):
    __slots__ = ("watcher_id",)
    WATCHER_ID_FIELD_NUMBER: _ClassVar[int]
    watcher_id: str
    def __init__(self, watcher_id: _Optional[str] = ...) -> None: ...

class WatchPolicyResponse(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: _common_pb2.PolicyVersion
    def __init__(self, policy: _Optional[_Union[_common_pb2.PolicyVersion, _Mapping]] = ...) -> None: ...

class GetResumePointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetResumePointResponse(_message.Message):
    __slots__ = ("resume_point",)
    RESUME_POINT_FIELD_NUMBER: _ClassVar[int]
    resume_point: _common_pb2.ResumePoint
    def __init__(self, resume_point: _Optional[_Union[_common_pb2.ResumePoint, _Mapping]] = ...) -> None: ...
