"""TrainerService: translates protos to the trainer's domain objects and back.

PushSamples is a bidirectional stream: a reader task feeds samples to the Intake while
this generator yields what the Intake queues for the producer (acks, credit grants,
the resume point on the first message, done). No training logic here.
"""

from __future__ import annotations

import asyncio
from typing import cast

import grpc

from agrpo.services.common import weight_transports
from agrpo.services.common.errors import InvalidArgument, Unavailable, grpc_errors
from agrpo.services.common.identity import Identity, now_timestamp
from agrpo.services.common.logging import get_logger
from agrpo.services.common.versions import lineage_to_proto, sample_version
from agrpo.v1 import common_pb2
from agrpo.v1 import trainer_service_pb2 as trainer_pb
from agrpo.v1 import trainer_service_pb2_grpc as trainer_grpc

from .intake import Outbound
from .sample import MAX_ID_CHARS, Outcome, Sample

log = get_logger("trainer.servicer")

def _transport_enum(name: str) -> common_pb2.WeightTransport:
    """The contract's WeightTransport value of a registered transport (0 when unknown)."""
    return common_pb2.WeightTransport.Value(weight_transports.proto_name(name)) \
        if name in weight_transports.TRANSPORTS else common_pb2.WEIGHT_TRANSPORT_UNSPECIFIED


def _outcome_enum(outcome: Outcome) -> trainer_pb.SampleOutcome:
    """The contract's SampleOutcome value (Outcome's values mirror it; the stubs' enum type is not int)."""
    return cast(trainer_pb.SampleOutcome, int(outcome))


def sample_from_proto(msg: common_pb2.RolloutSample) -> Sample:
    """Staleness is judged by the oldest version that produced a token (spans included); a
    policy_version newer than that is kept as `sent_version` (Sample.validate refuses it)."""
    spans = [(sp.policy_version, sp.start, sp.end) for sp in msg.version_spans]
    oldest = sample_version(msg.policy_version, (v for v, _, _ in spans))
    return Sample(
        sample_id=msg.sample_id, group_id=msg.group_id or msg.sample_id,
        prompt_key=(msg.prompt_key.dataset_index, msg.prompt_key.epoch),
        policy_version=oldest, version_spans=spans, input_ids=list(msg.input_ids),
        completion_mask=list(msg.completion_mask), behavior_logprobs=list(msg.behavior_logprobs),
        advantage=msg.advantage, reward=msg.reward, producer_id=msg.producer_id,
        prompt_length=msg.prompt_length, reward_components=dict(msg.reward_components),
        metrics=dict(msg.metrics), prompt_text=msg.prompt_text, completion_text=msg.completion_text,
        reward_errors=dict(msg.reward_errors), group_size=msg.group_size,
        sent_version=msg.policy_version if msg.policy_version != oldest else None)


def _prompt_key(key) -> common_pb2.PromptKey:
    return common_pb2.PromptKey(dataset_index=key[0], epoch=key[1])


class TrainerServicer(trainer_grpc.TrainerServiceServicer):
    """The gRPC face of a running trainer (`app` is agrpo.services.trainer.app.TrainerApp)."""

    def __init__(self, app) -> None:
        self.app = app
        self.identity: Identity = app.identity

    def _version(self) -> int:
        return self.app.state.version

    def _adapter(self) -> str:
        """The newest LoRA adapter the servers hold (adapter-only sync), else ""."""
        current = self.app.board.current
        return current.lora_adapter if current is not None else ""

    def resume_point(self) -> common_pb2.ResumePoint:
        ledger = self.app.state.ledger
        return common_pb2.ResumePoint(step=self.app.state.step, policy_version=self._version(),
                                      completed_epochs=ledger.completed_epochs,
                                      trained=[_prompt_key(k) for k in ledger.unfinished_keys()],
                                      lineage=lineage_to_proto(self.app.state.lineage))

    def _response(self, out: Outbound) -> trainer_pb.PushSamplesResponse:
        acks = [trainer_pb.SampleAck(sample_id=a.sample_id, outcome=_outcome_enum(a.outcome), reason=a.reason,
                                     prompt_key=_prompt_key(a.prompt_key)) for a in out.acks]
        msg = trainer_pb.PushSamplesResponse(acks=acks, credits=out.credits,
                                             policy_version=self._version(), done=out.done,
                                             lora_adapter=self._adapter())
        if out.first:
            msg.resume_point.CopyFrom(self.resume_point())
        return msg

    @grpc_errors
    async def PushSamples(self, request_iterator, context):
        """Bytes that do not parse end the stream with INVALID_ARGUMENT (grpc_errors maps the
        reader's DecodeError); messages over the size limit end it with RESOURCE_EXHAUSTED."""
        if not self.app.ready:
            raise Unavailable("trainer is starting (model loading or first weight sync)")
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("payload") != "hello":
            raise InvalidArgument("the first PushSamples message must be hello")
        if len(first.hello.producer_id) > MAX_ID_CHARS:
            raise InvalidArgument(f"producer_id longer than {MAX_ID_CHARS} characters")
        intake = self.app.intake
        stream = intake.open(first.hello.producer_id or context.peer(), first.hello.prompts_per_epoch)
        reader = asyncio.create_task(self._read(request_iterator, stream))
        try:
            while True:
                out = await stream.outbox.get()
                if out is None:  # replaced by a newer stream, or the reader finished
                    break
                yield self._response(out)
            failure = reader.exception() if reader.done() and not reader.cancelled() else None
            if failure is not None:
                raise failure  # e.g. a message that does not parse
        finally:
            reader.cancel()
            intake.close(stream)

    async def _read(self, request_iterator, stream) -> None:
        """Feed the intake until the producer half-closes; a failure ends the stream (PushSamples
        raises it after the acks already queued)."""
        try:
            async for req in request_iterator:
                kind = req.WhichOneof("payload")
                if kind == "sample":
                    self.app.intake.receive(stream, sample_from_proto(req.sample))
                elif kind == "hello":
                    log.warning("ignoring a second hello from %s", stream.producer_id)
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
        finally:
            stream.send(None)

    @grpc_errors
    async def WatchPolicy(self, request, context):
        queue = self.app.board.subscribe()
        try:
            while True:
                info = await queue.get()
                if info is None:
                    return
                policy = common_pb2.PolicyVersion(
                    version=info.version, step=info.step, weight_label=info.weight_label,
                    transport=_transport_enum(info.transport), weights_uri=info.weights_uri,
                    synced_servers=list(info.synced_servers), published_at=now_timestamp(),
                    max_staleness=self.app.cfg.max_staleness, lineage=lineage_to_proto(info.lineage),
                    lora_adapter=info.lora_adapter)
                yield trainer_pb.WatchPolicyResponse(policy=policy)
        finally:
            self.app.board.unsubscribe(queue)

    @grpc_errors
    async def Heartbeat(self, request, context):
        return common_pb2.HeartbeatResponse(receiver=self.identity.info(), policy_version=self._version(),
                                            sent_at=now_timestamp())

    @grpc_errors
    async def GetStatus(self, request, context):
        status = common_pb2.TrainerStatus(**self.app.status(), resume_point=self.resume_point())
        return common_pb2.GetStatusResponse(service=self.identity.info(), trainer=status)

    @grpc_errors
    async def GetResumePoint(self, request, context):
        return trainer_pb.GetResumePointResponse(resume_point=self.resume_point())
