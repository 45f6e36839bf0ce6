"""PushSamples domain logic: producers, credits, dedupe and acknowledgement routing.

Credits pace generation (services/trainer/pacing.py): a producer holds a credit for
every sample it dispatches, generates or holds, and sends one sample per credit. The
room the Pace allows (what max_staleness + 1 versions consume, less what is
outstanding, buffered or consumed at this version) is granted as credits, spread over
the open streams; it opens when a version is published and when a sample leaves
without training. A duplicate or rejected
sample returns its credit at once; so does a re-send of a sample still waiting to be
trained, which is acked ACCEPTED again (not DUPLICATE: it is not final yet, and the
producer must keep it until TRAINED). DUPLICATE means "already trained". Acks go to the producer's *current* stream (by
producer_id), so a producer that reconnects gets the TRAINED acks of samples it sent
on an earlier stream. No grpc here: the servicer turns `Outbound` into protos.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, cast, runtime_checkable

from .buffer import SampleBuffer
from .ledger import Ledger
from .pacing import Pace
from .sample import Ack, Outcome, PromptKey, Sample

ALREADY_PENDING = "already buffered; TRAINED follows"
OTHER_GROUP = "prompt already trained by another group (exactly once per epoch)"
DOOMED_GROUP = "a row of its group cannot be trained: the group is dropped whole and its prompt re-issued"


@runtime_checkable
class IntakeHooks(Protocol):
    """What the intake asks of the trainer it feeds (TrainerApp implements it)."""

    def version_problem(self, sample: Sample) -> str | None:
        """Why the sample's versions cannot be trained here (off the lineage, too new), or None."""

    def on_intake(self, kind: str, sample: Sample | None) -> None:
        """A sample was received, or refused ("duplicate", "rejected", ...): for metrics."""


@runtime_checkable
class ModelLimits(Protocol):
    """The loaded model's bounds on a sample (TrainerLoop implements it)."""

    def token_budget(self) -> int | None:
        """The most tokens a sample may have (None: no bound yet)."""

    def vocab_size(self) -> int | None:
        """The size of the model's vocabulary: every token id must index it."""


class AdmitAll:
    """IntakeHooks that find no problem and count nothing (tests, tools)."""

    def version_problem(self, sample: Sample) -> str | None:
        return None

    def on_intake(self, kind: str, sample: Sample | None) -> None:
        return None


@dataclass
class IntakeStats:
    """What PushSamples took in, and why samples were not buffered (by reason)."""

    received: int = 0
    drops: Counter = field(default_factory=Counter)


@dataclass
class Outbound:
    """One message to a producer: acks, a credit grant, and flags."""

    acks: list[Ack] = field(default_factory=list)
    credits: int = 0
    first: bool = False
    done: bool = False


class ProducerStream:
    """One open PushSamples stream."""

    def __init__(self, producer_id: str) -> None:
        self.producer_id = producer_id
        self.outbox: asyncio.Queue[Outbound | None] = asyncio.Queue()
        self.outstanding = 0  # credits granted and not yet used

    def send(self, msg: Outbound | None) -> None:
        """Queue `msg` for the producer; None closes the stream."""
        self.outbox.put_nowait(msg)


class Intake:
    """Admits samples into the buffer and routes acks and credits (event-loop only)."""

    def __init__(self, buffer: SampleBuffer, ledger: Ledger, pace: Pace | None = None,
                 hooks: IntakeHooks | None = None) -> None:
        self.buffer, self.ledger = buffer, ledger
        self.pace = pace or Pace(max_staleness=0, per_step=buffer.capacity, capacity=buffer.capacity)
        self.hooks: IntakeHooks = hooks or AdmitAll()
        self.limits: ModelLimits | None = None  # bind_limits(), once the model is loaded
        self.stats = IntakeStats()
        self.streams: dict[str, ProducerStream] = {}
        self.pending: set[str] = set()  # accepted, not yet settled (buffered or in a batch)
        self.done = False

    def bind_limits(self, limits: ModelLimits) -> None:
        """Late, by design: the intake is built with the gRPC server, the model only in
        TrainerApp.boot(). Until then PushSamples is refused (the servicer checks `ready`),
        so no sample is judged without the model's limits."""
        self.limits = limits

    def open(self, producer_id: str, prompts_per_epoch: int) -> ProducerStream:
        """A new stream replaces the producer's previous one; grant free slots."""
        old = self.streams.pop(producer_id, None)
        if old is not None:
            old.send(None)
        if prompts_per_epoch:
            self.ledger.prompts_per_epoch = prompts_per_epoch
        stream = ProducerStream(producer_id)
        self.streams[producer_id] = stream
        grant = 0 if self.done else self._free()
        stream.outstanding += grant
        stream.send(Outbound(credits=grant, first=True, done=self.done))
        return stream

    def close(self, stream: ProducerStream) -> None:
        """The stream ended: its producer's incomplete groups are forgotten without an answer
        (a producer that reconnects sends them again whole; one that died never will)."""
        if self.streams.get(stream.producer_id) is stream:
            del self.streams[stream.producer_id]
            for s in self.buffer.discard_incomplete(stream.producer_id):
                self.pending.discard(s.sample_id)
        self.regrant()

    def _free(self) -> int:
        outstanding = sum(s.outstanding for s in self.streams.values())
        return min(self.pace.room(len(self.buffer), outstanding), max(0, self.buffer.free - outstanding))

    def version_moved(self, carried: int = 0) -> None:
        """The trainer's version moved: consumption counts against it (Pace.version_moved)."""
        self.pace.version_moved(carried)

    def version_published(self) -> None:
        """The new version is in vLLM: the next generation's room opens."""
        self.pace.version_live()
        self.regrant()

    def receive(self, stream: ProducerStream, sample: Sample) -> Outcome:
        """Admit one sample: ACCEPTED, DUPLICATE (credit back) or REJECTED (credit back)."""
        stream.outstanding = max(0, stream.outstanding - 1)
        self.stats.received += 1
        self.hooks.on_intake("received", sample)
        sample.producer_id = sample.producer_id or stream.producer_id
        outcome, reason = self._judge(sample)
        resend = reason == ALREADY_PENDING
        if outcome is Outcome.ACCEPTED and not resend:
            if self.buffer.free <= 0:
                outcome, reason = Outcome.REJECTED, "buffer full: sent without credit"
            elif self.buffer.put(sample):
                self.pending.add(sample.sample_id)
            else:
                outcome, reason = Outcome.DROPPED_STALE, DOOMED_GROUP
        self._keep_groups_whole(sample, outcome)
        ack = Ack(sample.sample_id, outcome, cast(PromptKey, tuple(sample.prompt_key)), reason)
        credits = 0
        if outcome is not Outcome.ACCEPTED or resend:
            kind = {Outcome.DUPLICATE: "duplicate", Outcome.REJECTED: "rejected",
                    Outcome.DROPPED_STALE: "off_lineage"}.get(outcome, "resent_pending")
            self.stats.drops[kind] += 1
            self.hooks.on_intake(kind, sample)
            credits = 0 if self.done else 1
            stream.outstanding += credits
        stream.send(Outbound(acks=[ack], credits=credits))
        return outcome

    def _keep_groups_whole(self, sample: Sample, outcome: Outcome) -> None:
        """A malformed row leaves its group (the rest trains without it); a row off the
        lineage dooms its group, whose rows held so far are dropped with it."""
        if outcome is Outcome.REJECTED:
            self.buffer.expect_fewer(sample)
        elif outcome is Outcome.DROPPED_STALE:
            mates = self.buffer.doom(sample.group_id)
            if mates:
                self.stats.drops["off_lineage"] += len(mates)
                self.settle(mates, Outcome.DROPPED_STALE, DOOMED_GROUP)

    def _judge(self, sample: Sample) -> tuple[Outcome, str]:
        # Malformed first: a broken copy of a known id is refused, not taken for a re-send.
        problem = sample.validate(self.limits.vocab_size() if self.limits else None)
        if problem:
            return Outcome.REJECTED, problem
        if self.ledger.is_trained(sample.sample_id):
            return Outcome.DUPLICATE, "already trained"
        if self.ledger.owned_by_other(sample):
            return Outcome.DUPLICATE, OTHER_GROUP
        if sample.sample_id in self.pending:
            # Not final yet: the producer must keep it until TRAINED, which will reach
            # its current stream. So ACCEPTED again (credit back), not DUPLICATE.
            return Outcome.ACCEPTED, ALREADY_PENDING
        problem = self.hooks.version_problem(sample)
        if problem:
            return Outcome.DROPPED_STALE, problem
        limit = self.limits.token_budget() if self.limits else None
        if limit and len(sample) > limit:
            return Outcome.REJECTED, f"oversize: {len(sample)} tokens > {limit}"
        return Outcome.ACCEPTED, ""

    def settle(self, samples: Iterable[Sample], outcome: Outcome, reason: str = "") -> None:
        """Route final acks (TRAINED / DROPPED_STALE / REJECTED) to current streams."""
        by_producer: dict[str, list[Ack]] = {}
        for s in samples:
            self.pending.discard(s.sample_id)
            ack = Ack(s.sample_id, outcome, cast(PromptKey, tuple(s.prompt_key)), reason)
            by_producer.setdefault(s.producer_id, []).append(ack)
        for producer_id, acks in by_producer.items():
            stream = self.streams.get(producer_id)
            if stream is not None:
                stream.send(Outbound(acks=acks))

    def regrant(self) -> None:
        """Hand free slots to open streams, fewest outstanding first."""
        if self.done or not self.streams:
            return
        free = self._free()
        streams = sorted(self.streams.values(), key=lambda s: s.outstanding)
        for i, stream in enumerate(streams):
            share = free // len(streams) + (1 if i < free % len(streams) else 0)
            if share:
                stream.outstanding += share
                stream.send(Outbound(credits=share))

    def finish(self) -> None:
        """Training is over: tell every producer (done=true) and grant nothing more."""
        self.done = True
        for stream in self.streams.values():
            stream.send(Outbound(done=True))
