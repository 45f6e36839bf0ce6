"""A real gRPC TrainerService standing in for the trainer in rollout integration tests.

It follows the policy-version protocol of the project: hello -> resume point +
credit grant (free buffer slots), ACCEPTED on receipt, TRAINED (or
DROPPED_STALE) when its consumer takes a sample, DUPLICATE for a known id,
credits returned as slots free. Tests publish versions, pause consumption
("stop reading"), and read what was received and trained.
"""

from __future__ import annotations

import asyncio
from collections import deque

import grpc

from agrpo.services.common.identity import Identity, now_timestamp
from agrpo.v1 import common_pb2
from agrpo.v1 import trainer_service_pb2 as trainer_pb
from agrpo.v1 import trainer_service_pb2_grpc as trainer_grpc

ACCEPTED = trainer_pb.SAMPLE_OUTCOME_ACCEPTED
TRAINED = trainer_pb.SAMPLE_OUTCOME_TRAINED
DUPLICATE = trainer_pb.SAMPLE_OUTCOME_DUPLICATE
STALE = trainer_pb.SAMPLE_OUTCOME_DROPPED_STALE


class FakeTrainer(trainer_grpc.TrainerServiceServicer):
    """In-process trainer stand-in on a real port."""

    def __init__(self, *, queue_maxsize: int = 64, max_staleness: int = 4, port: int = 0,
                 train_delay_s: float = 0.0) -> None:
        self.capacity = queue_maxsize
        self.max_staleness = max_staleness
        self.port = port
        self.train_delay_s = train_delay_s
        self.identity = Identity("trainer")
        self.version = 0
        self.buffer: deque[common_pb2.RolloutSample] = deque()
        self.received: list[common_pb2.RolloutSample] = []
        self.trained: list[common_pb2.RolloutSample] = []
        self.dropped_stale: list[common_pb2.RolloutSample] = []
        self.known_ids: set[str] = set()
        self.trained_keys: dict[tuple[int, int], int] = {}
        self.completed_epochs = 0
        self.reading = asyncio.Event()
        self.reading.set()
        self.done = False
        self.hellos: list[trainer_pb.PushSamplesHello] = []
        self.max_buffered = 0
        self._streams: dict[str, asyncio.Queue] = {}
        self._watchers: list[asyncio.Queue] = []
        self._server: grpc.aio.Server | None = None
        self._consumer: asyncio.Task | None = None

    async def start(self) -> int:
        self._server = grpc.aio.server()
        trainer_grpc.add_TrainerServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self._server.start()
        self._consumer = asyncio.create_task(self._consume())
        return self.port

    async def stop(self) -> None:
        if self._consumer:
            self._consumer.cancel()
        await self._server.stop(0)

    # Test controls
    def publish(self, version: int) -> None:
        self.version = version
        for q in self._watchers:
            q.put_nowait(version)
        self._send_all(trainer_pb.PushSamplesResponse(policy_version=version))

    def stop_reading(self) -> None:
        self.reading.clear()

    def resume_reading(self) -> None:
        self.reading.set()

    def finish(self) -> None:
        self.done = True
        self._send_all(trainer_pb.PushSamplesResponse(done=True, policy_version=self.version))

    def _send_all(self, resp) -> None:
        for q in self._streams.values():
            q.put_nowait(resp)

    def _send(self, producer: str, resp) -> None:
        q = self._streams.get(producer)
        if q is not None:
            q.put_nowait(resp)

    # Consumer: "trains" buffered samples one at a time
    async def _consume(self) -> None:
        while True:
            await self.reading.wait()
            if not self.buffer:
                await asyncio.sleep(0.01)
                continue
            sample = self.buffer.popleft()
            if self.train_delay_s:
                await asyncio.sleep(self.train_delay_s)
            key = (sample.prompt_key.dataset_index, sample.prompt_key.epoch)
            if self.version - sample.policy_version > self.max_staleness:
                self.dropped_stale.append(sample)
                outcome = STALE
            else:
                self.trained.append(sample)
                self.trained_keys[key] = self.trained_keys.get(key, 0) + 1
                outcome = TRAINED
            ack = trainer_pb.SampleAck(sample_id=sample.sample_id, outcome=outcome, prompt_key=sample.prompt_key)
            self._send(sample.producer_id, trainer_pb.PushSamplesResponse(
                acks=[ack], credits=1, policy_version=self.version))

    def resume_point(self) -> common_pb2.ResumePoint:
        return common_pb2.ResumePoint(
            policy_version=self.version, completed_epochs=self.completed_epochs,
            trained=[common_pb2.PromptKey(dataset_index=i, epoch=e) for (i, e) in self.trained_keys])

    # RPCs
    async def PushSamples(self, request_iterator, context):
        first = await request_iterator.__anext__()
        hello = first.hello
        self.hellos.append(hello)
        out: asyncio.Queue = asyncio.Queue()
        self._streams[hello.producer_id] = out
        yield trainer_pb.PushSamplesResponse(
            resume_point=self.resume_point(), credits=self.capacity - len(self.buffer),
            policy_version=self.version, done=self.done)
        reader = asyncio.create_task(self._read(request_iterator, hello.producer_id, out))
        get = None
        try:
            while True:
                get = asyncio.create_task(out.get())
                finished, _ = await asyncio.wait([get, reader], return_when=asyncio.FIRST_COMPLETED)
                if get not in finished:
                    return
                yield get.result()
        finally:
            reader.cancel()
            if get is not None:
                get.cancel()
            if self._streams.get(hello.producer_id) is out:
                del self._streams[hello.producer_id]

    async def _read(self, request_iterator, producer: str, out: asyncio.Queue) -> None:
        async for req in request_iterator:
            if not req.HasField("sample"):
                continue
            s = req.sample
            self.received.append(s)
            if s.sample_id in self.known_ids:
                out.put_nowait(trainer_pb.PushSamplesResponse(acks=[trainer_pb.SampleAck(
                    sample_id=s.sample_id, outcome=DUPLICATE, prompt_key=s.prompt_key)], credits=1))
                continue
            self.known_ids.add(s.sample_id)
            self.buffer.append(s)
            self.max_buffered = max(self.max_buffered, len(self.buffer))
            out.put_nowait(trainer_pb.PushSamplesResponse(acks=[trainer_pb.SampleAck(
                sample_id=s.sample_id, outcome=ACCEPTED, prompt_key=s.prompt_key)]))

    async def WatchPolicy(self, request, context):
        q: asyncio.Queue = asyncio.Queue()
        self._watchers.append(q)
        try:
            yield common_pb2.PolicyVersion(version=self.version, max_staleness=self.max_staleness)
            while True:
                v = await q.get()
                yield common_pb2.PolicyVersion(version=v, max_staleness=self.max_staleness)
        finally:
            self._watchers.remove(q)

    async def Heartbeat(self, request, context):
        return common_pb2.HeartbeatResponse(receiver=self.identity.info(), policy_version=self.version,
                                            sent_at=now_timestamp())

    async def GetResumePoint(self, request, context):
        return trainer_pb.GetResumePointResponse(resume_point=self.resume_point())
