from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCORE_STATUS_UNSPECIFIED: _ClassVar[ScoreStatus]
    SCORE_STATUS_OK: _ClassVar[ScoreStatus]
    SCORE_STATUS_NOT_APPLICABLE: _ClassVar[ScoreStatus]
    SCORE_STATUS_FAILED: _ClassVar[ScoreStatus]
    SCORE_STATUS_TIMEOUT: _ClassVar[ScoreStatus]
SCORE_STATUS_UNSPECIFIED: ScoreStatus
SCORE_STATUS_OK: ScoreStatus
SCORE_STATUS_NOT_APPLICABLE: ScoreStatus
SCORE_STATUS_FAILED: ScoreStatus
SCORE_STATUS_TIMEOUT: ScoreStatus

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., name: _Optional[str] = ...) -> None: ...

class Text(_message.Message):
    __slots__ = ("text", "messages")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    text: str
    messages: Conversation
    def __init__(self, text: _Optional[str] = ..., messages: _Optional[_Union[Conversation, _Mapping]] = ...) -> None: ...

class Conversation(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class ScoreItem(_message.Message):
    __slots__ = ("prompt", "completion", "completion_ids", "columns")
    class ColumnsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _struct_pb2.Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_IDS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    prompt: Text
    completion: Text
    completion_ids: _containers.RepeatedScalarFieldContainer[int]
    columns: _containers.MessageMap[str, _struct_pb2.Value]
    def __init__(self, prompt: _Optional[_Union[Text, _Mapping]] = ..., completion: _Optional[_Union[Text, _Mapping]] = ..., completion_ids: _Optional[_Iterable[int]] = ..., columns: _Optional[_Mapping[str, _struct_pb2.Value]] = ...) -> None: ...

class RewardFunctionRef(_message.Message):
    __slots__ = ("name", "weight")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    name: str
    weight: float
    def __init__(self, name: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("request_id", "items", "functions")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    items: _containers.RepeatedCompositeFieldContainer[ScoreItem]
    functions: _containers.RepeatedCompositeFieldContainer[RewardFunctionRef]
    def __init__(self, request_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[ScoreItem, _Mapping]]] = ..., functions: _Optional[_Iterable[_Union[RewardFunctionRef, _Mapping]]] = ...) -> None: ...

class FunctionScore(_message.Message):
    __slots__ = ("name", "status", "value", "weight", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    status: ScoreStatus
    value: float
    weight: float
    reason: str
    def __init__(self, name: _Optional[str] = ..., status: _Optional[_Union[ScoreStatus, str]] = ..., value: _Optional[float] = ..., weight: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class ItemScore(_message.Message):
    __slots__ = ("total", "scores")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    total: float
    scores: _containers.RepeatedCompositeFieldContainer[FunctionScore]
    def __init__(self, total: _Optional[float] = ..., scores: _Optional[_Iterable[_Union[FunctionScore, _Mapping]]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("request_id", "items", "function_latency_ms")
    class FunctionLatencyMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    items: _containers.RepeatedCompositeFieldContainer[ItemScore]
    function_latency_ms: _containers.ScalarMap[str, float]
    def __init__(self, request_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[ItemScore, _Mapping]]] = ..., function_latency_ms: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ScoreStreamRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: ScoreRequest
    def __init__(self, request: _Optional[_Union[ScoreRequest, _Mapping]] = ...) -> None: ...

class ScoreStreamResponse(_message.Message):
    __slots__ = ("response", "code", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: ScoreResponse
    code: int
    error: str
    def __init__(self, response: _Optional[_Union[ScoreResponse, _Mapping]] = ..., code: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class ListRewardFunctionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RewardFunctionInfo(_message.Message):
    __slots__ = ("name", "description", "required_columns", "default_weight", "builtin", "default_enabled", "source")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    BUILTIN_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_ENABLED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    required_columns: _containers.RepeatedScalarFieldContainer[str]
    default_weight: float
    builtin: bool
    default_enabled: bool
    source: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., required_columns: _Optional[_Iterable[str]] = ..., default_weight: _Optional[float] = ..., builtin: _Optional[bool] = ..., default_enabled: _Optional[bool] = ..., source: _Optional[str] = ...) -> None: ...

class ListRewardFunctionsResponse(_message.Message):
    __slots__ = ("functions",)
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    functions: _containers.RepeatedCompositeFieldContainer[RewardFunctionInfo]
    def __init__(self, functions: _Optional[_Iterable[_Union[RewardFunctionInfo, _Mapping]]] = ...) -> None: ...
