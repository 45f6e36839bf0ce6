import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WeightTransport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_TRANSPORT_UNSPECIFIED: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_NCCL: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_HTTP: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_SHARED_PATH: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_IPC: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_LOCAL: _ClassVar[WeightTransport]

class ServingState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVING_STATE_UNSPECIFIED: _ClassVar[ServingState]
    SERVING_STATE_STARTING: _ClassVar[ServingState]
    SERVING_STATE_SERVING: _ClassVar[ServingState]
    SERVING_STATE_DONE: _ClassVar[ServingState]
    SERVING_STATE_STOPPING: _ClassVar[ServingState]
WEIGHT_TRANSPORT_UNSPECIFIED: WeightTransport
WEIGHT_TRANSPORT_NCCL: WeightTransport
WEIGHT_TRANSPORT_HTTP: WeightTransport
WEIGHT_TRANSPORT_SHARED_PATH: WeightTransport
WEIGHT_TRANSPORT_IPC: WeightTransport
WEIGHT_TRANSPORT_LOCAL: WeightTransport
SERVING_STATE_UNSPECIFIED: ServingState
SERVING_STATE_STARTING: ServingState
SERVING_STATE_SERVING: ServingState
SERVING_STATE_DONE: ServingState
SERVING_STATE_STOPPING: ServingState

class PromptKey(_message.Message):
    __slots__ = ("dataset_index", "epoch")
    DATASET_INDEX_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    dataset_index: int
    epoch: int
    def __init__(self, dataset_index: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class VersionSpan(_message.Message):
    __slots__ = ("policy_version", "start", "end")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    start: int
    end: int
    def __init__(self, policy_version: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class RolloutSample(_message.Message):
    __slots__ = ("sample_id", "group_id", "prompt_key", "policy_version", "version_spans", "input_ids", "completion_mask", "behavior_logprobs", "prompt_length", "advantage", "reward", "reward_components", "metrics", "generation_index", "row_index", "prompt_text", "completion_text", "created_at", "producer_id", "reward_errors", "group_size")
    class RewardComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class RewardErrorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_KEY_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_SPANS_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_MASK_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOR_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGE_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_INDEX_FIELD_NUMBER: _ClassVar[int]
    ROW_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TEXT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_ERRORS_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    sample_id: str
    group_id: str
    prompt_key: PromptKey
    policy_version: int
    version_spans: _containers.RepeatedCompositeFieldContainer[VersionSpan]
    input_ids: _containers.RepeatedScalarFieldContainer[int]
    completion_mask: _containers.RepeatedScalarFieldContainer[int]
    behavior_logprobs: _containers.RepeatedScalarFieldContainer[float]
    prompt_length: int
    advantage: float
    reward: float
    reward_components: _containers.ScalarMap[str, float]
    metrics: _containers.ScalarMap[str, float]
    generation_index: int
    row_index: int
    prompt_text: str
    completion_text: str
    created_at: _timestamp_pb2.Timestamp
    producer_id: str
    reward_errors: _containers.ScalarMap[str, str]
    group_size: int
    def __init__(self, sample_id: _Optional[str] = ..., group_id: _Optional[str] = ..., prompt_key: _Optional[_Union[PromptKey, _Mapping]] = ..., policy_version: _Optional[int] = ..., version_spans: _Optional[_Iterable[_Union[VersionSpan, _Mapping]]] = ..., input_ids: _Optional[_Iterable[int]] = ..., completion_mask: _Optional[_Iterable[int]] = ..., behavior_logprobs: _Optional[_Iterable[float]] = ..., prompt_length: _Optional[int] = ..., advantage: _Optional[float] = ..., reward: _Optional[float] = ..., reward_components: _Optional[_Mapping[str, float]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., generation_index: _Optional[int] = ..., row_index: _Optional[int] = ..., prompt_text: _Optional[str] = ..., completion_text: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., producer_id: _Optional[str] = ..., reward_errors: _Optional[_Mapping[str, str]] = ..., group_size: _Optional[int] = ...) -> None: ...

class PolicyVersion(_message.Message):
    __slots__ = ("version", "step", "weight_label", "transport", "weights_uri", "synced_servers", "published_at", "max_staleness", "lineage", "lora_adapter")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_LABEL_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_URI_FIELD_NUMBER: _ClassVar[int]
    SYNCED_SERVERS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    version: int
    step: int
    weight_label: str
    transport: WeightTransport
    weights_uri: str
    synced_servers: _containers.RepeatedScalarFieldContainer[str]
    published_at: _timestamp_pb2.Timestamp
    max_staleness: int
    lineage: _containers.RepeatedCompositeFieldContainer[LineageSegment]
    lora_adapter: str
    def __init__(self, version: _Optional[int] = ..., step: _Optional[int] = ..., weight_label: _Optional[str] = ..., transport: _Optional[_Union[WeightTransport, str]] = ..., weights_uri: _Optional[str] = ..., synced_servers: _Optional[_Iterable[str]] = ..., published_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_staleness: _Optional[int] = ..., lineage: _Optional[_Iterable[_Union[LineageSegment, _Mapping]]] = ..., lora_adapter: _Optional[str] = ...) -> None: ...

class LineageSegment(_message.Message):
    __slots__ = ("first_version", "last_version", "first_index")
    FIRST_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_VERSION_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    first_version: int
    last_version: int
    first_index: int
    def __init__(self, first_version: _Optional[int] = ..., last_version: _Optional[int] = ..., first_index: _Optional[int] = ...) -> None: ...

class ServiceInfo(_message.Message):
    __slots__ = ("service", "instance_id", "version", "state", "uptime_s")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    service: str
    instance_id: str
    version: str
    state: ServingState
    uptime_s: float
    def __init__(self, service: _Optional[str] = ..., instance_id: _Optional[str] = ..., version: _Optional[str] = ..., state: _Optional[_Union[ServingState, str]] = ..., uptime_s: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("sender", "policy_version", "sent_at")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    sender: ServiceInfo
    policy_version: int
    sent_at: _timestamp_pb2.Timestamp
    def __init__(self, sender: _Optional[_Union[ServiceInfo, _Mapping]] = ..., policy_version: _Optional[int] = ..., sent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("receiver", "policy_version", "sent_at")
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    receiver: ServiceInfo
    policy_version: int
    sent_at: _timestamp_pb2.Timestamp
    def __init__(self, receiver: _Optional[_Union[ServiceInfo, _Mapping]] = ..., policy_version: _Optional[int] = ..., sent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("service", "trainer", "rollout")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    TRAINER_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    service: ServiceInfo
    trainer: TrainerStatus
    rollout: RolloutStatus
    def __init__(self, service: _Optional[_Union[ServiceInfo, _Mapping]] = ..., trainer: _Optional[_Union[TrainerStatus, _Mapping]] = ..., rollout: _Optional[_Union[RolloutStatus, _Mapping]] = ...) -> None: ...

class TrainerStatus(_message.Message):
    __slots__ = ("step", "policy_version", "completed_epochs", "prompts_trained", "samples_received", "samples_trained", "samples_dropped", "buffered_samples", "buffer_capacity", "target_steps", "resume_point", "idle_s", "busy_s", "pacing_window")
    class SamplesDroppedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_TRAINED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_TRAINED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    BUFFER_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    TARGET_STEPS_FIELD_NUMBER: _ClassVar[int]
    RESUME_POINT_FIELD_NUMBER: _ClassVar[int]
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    BUSY_S_FIELD_NUMBER: _ClassVar[int]
    PACING_WINDOW_FIELD_NUMBER: _ClassVar[int]
    step: int
    policy_version: int
    completed_epochs: int
    prompts_trained: int
    samples_received: int
    samples_trained: int
    samples_dropped: _containers.ScalarMap[str, int]
    buffered_samples: int
    buffer_capacity: int
    target_steps: int
    resume_point: ResumePoint
    idle_s: float
    busy_s: float
    pacing_window: int
    def __init__(self, step: _Optional[int] = ..., policy_version: _Optional[int] = ..., completed_epochs: _Optional[int] = ..., prompts_trained: _Optional[int] = ..., samples_received: _Optional[int] = ..., samples_trained: _Optional[int] = ..., samples_dropped: _Optional[_Mapping[str, int]] = ..., buffered_samples: _Optional[int] = ..., buffer_capacity: _Optional[int] = ..., target_steps: _Optional[int] = ..., resume_point: _Optional[_Union[ResumePoint, _Mapping]] = ..., idle_s: _Optional[float] = ..., busy_s: _Optional[float] = ..., pacing_window: _Optional[int] = ...) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("epoch", "prompts_issued", "prompts_reissued", "groups_in_flight", "samples_buffered", "samples_sent", "samples_acked", "drops", "policy_version", "trainer_connected", "trainer_silent_s", "servers", "samples_generated", "generation_idle_s", "generation_s")
    class DropsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_ISSUED_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_REISSUED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_BUFFERED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_SENT_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_ACKED_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAINER_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    TRAINER_SILENT_S_FIELD_NUMBER: _ClassVar[int]
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_GENERATED_FIELD_NUMBER: _ClassVar[int]
    GENERATION_IDLE_S_FIELD_NUMBER: _ClassVar[int]
    GENERATION_S_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    prompts_issued: int
    prompts_reissued: int
    groups_in_flight: int
    samples_buffered: int
    samples_sent: int
    samples_acked: int
    drops: _containers.ScalarMap[str, int]
    policy_version: int
    trainer_connected: bool
    trainer_silent_s: float
    servers: _containers.RepeatedCompositeFieldContainer[InferenceServerStatus]
    samples_generated: int
    generation_idle_s: float
    generation_s: float
    def __init__(self, epoch: _Optional[int] = ..., prompts_issued: _Optional[int] = ..., prompts_reissued: _Optional[int] = ..., groups_in_flight: _Optional[int] = ..., samples_buffered: _Optional[int] = ..., samples_sent: _Optional[int] = ..., samples_acked: _Optional[int] = ..., drops: _Optional[_Mapping[str, int]] = ..., policy_version: _Optional[int] = ..., trainer_connected: _Optional[bool] = ..., trainer_silent_s: _Optional[float] = ..., servers: _Optional[_Iterable[_Union[InferenceServerStatus, _Mapping]]] = ..., samples_generated: _Optional[int] = ..., generation_idle_s: _Optional[float] = ..., generation_s: _Optional[float] = ...) -> None: ...

class InferenceServerStatus(_message.Message):
    __slots__ = ("base_url", "up", "outstanding", "weight_label", "mean_latency_s", "failures")
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_LABEL_FIELD_NUMBER: _ClassVar[int]
    MEAN_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    base_url: str
    up: bool
    outstanding: int
    weight_label: str
    mean_latency_s: float
    failures: int
    def __init__(self, base_url: _Optional[str] = ..., up: _Optional[bool] = ..., outstanding: _Optional[int] = ..., weight_label: _Optional[str] = ..., mean_latency_s: _Optional[float] = ..., failures: _Optional[int] = ...) -> None: ...

class ResumePoint(_message.Message):
    __slots__ = ("step", "policy_version", "completed_epochs", "trained", "lineage")
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    TRAINED_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    step: int
    policy_version: int
    completed_epochs: int
    trained: _containers.RepeatedCompositeFieldContainer[PromptKey]
    lineage: _containers.RepeatedCompositeFieldContainer[LineageSegment]
    def __init__(self, step: _Optional[int] = ..., policy_version: _Optional[int] = ..., completed_epochs: _Optional[int] = ..., trained: _Optional[_Iterable[_Union[PromptKey, _Mapping]]] = ..., lineage: _Optional[_Iterable[_Union[LineageSegment, _Mapping]]] = ...) -> None: ...
