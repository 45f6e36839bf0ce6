"""Stream scored samples to the trainer over PushSamples, with credits and re-sends.

- The first message is `hello`; the first answer carries the resume point and
  the initial credit grant. One credit = one sample; no credit, no send.
- Every sample is held until every sample of its group is final at the trainer
  (TRAINED, DROPPED_STALE, REJECTED, or DUPLICATE: the trainer already has it).
  A lost stream is re-opened with back-off and every unfinished group is re-sent
  whole (the trainer de-duplicates by id), so a trainer restart cannot leave a
  half-trained group behind.
- A group that became too stale before its first sample went out is dropped
  here and its prompt re-issued (`on_group_done(key, False)`).
- `done=true` from the trainer ends the session for good.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from agrpo.services.common.identity import now_timestamp
from agrpo.services.common.logging import get_logger
from agrpo.services.common.timeouts import RECONNECT_MAX_S
from agrpo.services.common.versions import Lineage, lineage_from_proto, sample_versions
from agrpo.v1 import common_pb2
from agrpo.v1 import trainer_service_pb2 as trainer_pb
from agrpo.v1 import trainer_service_pb2_grpc as trainer_grpc

log = get_logger("rollout.sender")
FINAL = {trainer_pb.SAMPLE_OUTCOME_TRAINED: "trained", trainer_pb.SAMPLE_OUTCOME_DUPLICATE: "duplicate",
         trainer_pb.SAMPLE_OUTCOME_DROPPED_STALE: "stale", trainer_pb.SAMPLE_OUTCOME_REJECTED: "rejected"}


class SenderHooks(Protocol):
    """What the sender tells its owner (services/rollout/app.py) and asks of it."""

    def on_resume(self, resume_point: common_pb2.ResumePoint) -> None:
        """The trainer's resume point, on every (re)connection: what it trained, its version."""

    def on_group_done(self, key: tuple[int, int], ok: bool, reason: str) -> None:
        """Every sample of the group is final at the trainer; ok: some of it was trained."""

    def on_version(self, version: int, adapter: str = "") -> None:
        """The trainer's policy version, as a PushSamples answer carries it, and the newest LoRA
        adapter the servers hold (adapter-only sync, else "")."""

    def on_lineage(self, lineage: Lineage) -> None:
        """The trainer's lineage, from the resume point."""

    def on_credits(self) -> None:
        """New credits arrived: generation may start more groups."""

    def on_heard(self) -> None:
        """The trainer answered: it is alive."""

    def on_sent(self, sample: common_pb2.RolloutSample) -> None:
        """A sample left for the trainer."""

    def is_stale(self, version: int) -> bool:
        """A group of this version can no longer be trained."""

    def version(self) -> int:
        """The trainer's version as the owner knows it."""

    def heartbeat(self) -> common_pb2.HeartbeatRequest:
        """The heartbeat to send on an idle stream."""


@dataclass
class _Group:
    key: tuple[int, int]
    version: int
    sample_ids: list[str]
    versions: set[int] = field(default_factory=set)  # every version that produced a token
    outcomes: dict[str, str] = field(default_factory=dict)
    started: bool = False


class Sender:
    """Holds samples until the trainer is done with them and streams them under credit."""

    def __init__(self, channel: grpc.aio.Channel, *, producer_id: str, prompts_per_epoch: int,
                 heartbeat_s: float, reconnect_s: float, hooks: SenderHooks) -> None:
        self.stub = trainer_grpc.TrainerServiceStub(channel)
        self.producer_id = producer_id
        self.prompts_per_epoch = prompts_per_epoch
        self.heartbeat_s = heartbeat_s
        self.reconnect_s = reconnect_s
        self.hooks = hooks
        self.samples: OrderedDict[str, common_pb2.RolloutSample] = OrderedDict()
        self.groups: dict[str, _Group] = {}
        self.unsent: OrderedDict[str, None] = OrderedDict()  # produced, not sent: send order
        self.credits = 0
        self.connected = False
        self.done = asyncio.Event()
        self.sent = 0
        self.acked = 0
        self._wake = asyncio.Event()

    @property
    def held(self) -> int:
        """Samples produced and not yet final (unsent or awaiting TRAINED)."""
        return len(self.samples)

    @property
    def unsent_count(self) -> int:
        """Samples produced and not sent yet: each still needs a credit (asked at every
        capacity check, so it is a count kept, not a walk of the queue)."""
        return len(self.unsent)

    def add_group(self, key: tuple[int, int], version: int, samples: list) -> None:
        """Queue a scored group for sending."""
        gid = samples[0].group_id
        versions = set().union(*(sample_versions(s.policy_version, (sp.policy_version for sp in s.version_spans))
                                 for s in samples))
        self.groups[gid] = _Group(key, version, [s.sample_id for s in samples], versions)
        for s in samples:
            self.samples[s.sample_id] = s
            self.unsent[s.sample_id] = None
        self._wake.set()

    # Connection loop
    async def run(self) -> None:
        """Keep a PushSamples stream open until the trainer says done."""
        delay = self.reconnect_s
        while not self.done.is_set():
            try:
                await self._session()
                delay = self.reconnect_s
            except (grpc.aio.AioRpcError, ConnectionError) as exc:
                code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else type(exc).__name__
                log.warning("PushSamples stream lost (%s); reconnecting in %.1f s", code, delay)
            finally:
                self.connected = False
                self.credits = 0
            if self.done.is_set():
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)

    async def _session(self) -> None:
        call = self.stub.PushSamples()
        await call.write(trainer_pb.PushSamplesRequest(hello=trainer_pb.PushSamplesHello(
            producer_id=self.producer_id, prompts_per_epoch=self.prompts_per_epoch)))
        first = await call.read()
        if first is grpc.aio.EOF:
            raise ConnectionError("trainer closed the stream before answering hello")
        self.hooks.on_heard()
        self._adopt_resume(first.resume_point)
        self.connected = True
        # Re-send every sample of every unfinished group: a restarted trainer may have
        # lost samples it acknowledged as TRAINED (it de-duplicates those it kept).
        for g in self.groups.values():
            g.outcomes.clear()
        self.unsent = OrderedDict.fromkeys(self.samples)
        log.info("PushSamples connected: %d credits, %d samples to (re)send", first.credits, len(self.unsent))
        self._on_response(first)
        writer = asyncio.create_task(self._write_loop(call))
        try:
            while not self.done.is_set():
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    raise ConnectionError("trainer ended the stream")
                self._on_response(resp)
        finally:
            writer.cancel()
            if self.done.is_set():
                await _quiet(call.done_writing())
            call.cancel()

    def _adopt_resume(self, rp: common_pb2.ResumePoint) -> None:
        self.hooks.on_lineage(lineage_from_proto(rp.lineage))  # before any held group is re-sent
        trained = {(k.dataset_index, k.epoch) for k in rp.trained}
        for gid, g in list(self.groups.items()):
            if g.key in trained or g.key[1] < rp.completed_epochs:
                self._forget_group(gid)
                self.hooks.on_group_done(g.key, True, "resumed")
        self.hooks.on_resume(rp)

    # Writing
    async def _write_loop(self, call) -> None:
        try:
            await self._write_all(call)
        except asyncio.InvalidStateError:
            pass  # the call ended under us (trainer gone): the reading side reconnects

    async def _write_all(self, call) -> None:
        while True:
            sample = self._next_sendable()
            if sample is None:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.heartbeat_s)
                except TimeoutError:
                    await call.write(trainer_pb.PushSamplesRequest(heartbeat=self.hooks.heartbeat()))
                continue
            self.credits -= 1
            await call.write(trainer_pb.PushSamplesRequest(sample=sample))
            self.sent += 1
            self.hooks.on_sent(sample)

    def _next_sendable(self):
        while self.credits > 0 and self.unsent:
            sample = self.samples[next(iter(self.unsent))]  # a forgotten group leaves unsent too
            group = self.groups[sample.group_id]
            if not group.started and self._too_stale(group.version):
                self._drop_stale(sample.group_id)
                continue
            group.started = True
            self.unsent.popitem(last=False)
            return sample
        return None

    def _too_stale(self, version: int) -> bool:
        return self.hooks.is_stale(version)

    def drop_off_lineage(self, lineage) -> int:
        """Forget (never re-send) groups with a token of weights the trainer rolled back."""
        off = [gid for gid, g in self.groups.items() if not lineage.on_lineage(g.versions)]
        for gid in off:
            key = self.groups[gid].key
            self._forget_group(gid)
            self.hooks.on_group_done(key, False, "off_lineage")
        if off:
            log.warning("dropped %d held groups of weights the trainer rolled back", len(off))
        return len(off)

    def sweep_stale(self) -> int:
        """Drop groups not yet started that the current version made too stale."""
        stale = [gid for gid, g in self.groups.items() if not g.started and self._too_stale(g.version)]
        for gid in stale:
            self._drop_stale(gid)
        return len(stale)

    def _drop_stale(self, gid: str) -> None:
        key = self.groups[gid].key
        self._forget_group(gid)
        self.hooks.on_group_done(key, False, "stale_buffered")

    def _forget_group(self, gid: str) -> None:
        group = self.groups.pop(gid)
        for sid in group.sample_ids:
            self.samples.pop(sid, None)
            self.unsent.pop(sid, None)
        self._wake.set()

    # Reading
    def _on_response(self, resp: trainer_pb.PushSamplesResponse) -> None:
        self.hooks.on_heard()
        self.credits += resp.credits
        if resp.policy_version:  # before the credits it carries are spent (on_credits)
            self.hooks.on_version(resp.policy_version, resp.lora_adapter)
        for ack in resp.acks:
            self._on_ack(ack)
        if resp.credits:
            self._wake.set()
            self.hooks.on_credits()
        if resp.done:
            log.info("trainer says training is done")
            self.done.set()

    def _on_ack(self, ack: trainer_pb.SampleAck) -> None:
        outcome = FINAL.get(ack.outcome)
        sample = self.samples.get(ack.sample_id)
        if outcome is None or sample is None:
            return
        self.acked += 1
        group = self.groups.get(sample.group_id)
        if group is None:
            return
        group.outcomes[ack.sample_id] = outcome
        if len(group.outcomes) == len(group.sample_ids):
            self._forget_group(sample.group_id)
            results = set(group.outcomes.values())
            ok = bool(results & {"trained", "duplicate", "rejected"})
            self.hooks.on_group_done(group.key, ok, "stale_trainer" if not ok else ",".join(sorted(results)))
        self._wake.set()


async def _quiet(awaitable) -> None:
    try:
        await awaitable
    except Exception:  # noqa: BLE001 - closing a stream that may already be gone
        pass


def heartbeat_request(identity, version: int) -> common_pb2.HeartbeatRequest:
    """A HeartbeatRequest from this rollout instance."""
    return common_pb2.HeartbeatRequest(sender=identity.info(), policy_version=version,
                                       sent_at=now_timestamp())

