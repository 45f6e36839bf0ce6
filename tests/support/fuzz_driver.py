"""Sends tests/support/fuzz_samples.py's cases to a running trainer (and rollout) over gRPC.

`await fuzz(trainer_port, rollout_port, cases, n)` runs n cases: samples go on one main
PushSamples stream under credit (as a producer sends them); frames, first messages and
unary requests go through a generic stub that sends raw bytes, each on a call of its own,
`concurrency` at a time. Every call has a deadline: a call that runs into it is a hang. The
`FuzzReport` says what each case got (its final ack on the main stream; its first ack, else
the status code, on a call of its own) and which cases got something they must not.

A fresh stream learns that its frame was read from a probe sent after it: a sample whose id
is too long (`PROBE_ID`), REJECTED at once, so every ack before the probe's is the frame's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import grpc

from agrpo.v1 import common_pb2 as pb
from agrpo.v1 import trainer_service_pb2 as trainer_pb
from agrpo.v1 import trainer_service_pb2_grpc as trainer_grpc
from fuzz_samples import MAX_ID_CHARS, TRAINER, Case, FuzzCases

OUTCOMES = {v: k.removeprefix("SAMPLE_OUTCOME_") for k, v in trainer_pb.SampleOutcome.items()}
PROBE_ID = "probe-".ljust(MAX_ID_CHARS + 1, "x")
PROBE = trainer_pb.PushSamplesRequest(sample=pb.RolloutSample(sample_id=PROBE_ID)).SerializeToString()
_raw = dict(request_serializer=lambda b: b)


@dataclass
class FuzzReport:
    """What every case got; `failures` lists the ones that got what they must not."""

    got: dict[int, str] = field(default_factory=dict)
    cases: dict[int, Case] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def table(self) -> dict[str, Counter]:
        """Case kind -> Counter of outcomes (ack outcome, else status code)."""
        out: dict[str, Counter] = defaultdict(Counter)
        for i, case in self.cases.items():
            out[case.kind][self.got.get(i, "MISSING")] += 1
        return dict(sorted(out.items()))

    def format_table(self) -> str:
        rows = [("kind", "count", "outcomes")]
        for kind, counts in self.table().items():
            rows.append((kind, str(sum(counts.values())),
                         ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))))
        w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
        return "\n".join(f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows)

    def may_train(self) -> set[str]:
        return {c.sample_id for c in self.cases.values() if c.may_train and c.sample_id}

    def must_train(self) -> set[str]:
        return {c.sample_id for c in self.cases.values() if c.channel == "sample" and "TRAINED" in c.acks}


class MainStream:
    """The producer's own PushSamples stream: sends under credit, records every ack."""

    def __init__(self, channel: grpc.aio.Channel, producer_id: str = "fuzz-main") -> None:
        self.outgoing: asyncio.Queue = asyncio.Queue()
        self.outgoing.put_nowait(trainer_pb.PushSamplesRequest(hello=trainer_pb.PushSamplesHello(
            producer_id=producer_id)))
        self.acks: dict[str, list[tuple[str, str]]] = defaultdict(list)
        self.credits, self.version, self.first = 0, 0, asyncio.Event()
        self.call = trainer_grpc.TrainerServiceStub(channel).PushSamples(self._requests())
        self.reader = asyncio.create_task(self._read())

    async def _requests(self):
        while (msg := await self.outgoing.get()) is not None:
            yield msg

    async def _read(self) -> None:
        async for resp in self.call:
            self.credits += resp.credits
            self.version = max(self.version, resp.policy_version)
            for ack in resp.acks:
                self.acks[ack.sample_id].append((OUTCOMES[ack.outcome], ack.reason))
            self.first.set()

    async def send(self, sample: pb.RolloutSample, timeout: float) -> None:
        await self.wait(lambda: self.credits > 0, timeout, "a credit")
        self.credits -= 1
        self.outgoing.put_nowait(trainer_pb.PushSamplesRequest(sample=sample))

    async def wait(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.reader.done():
                self.reader.result()
                raise AssertionError(f"the main stream ended while waiting for {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:.0f} s for {what}")
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        self.outgoing.put_nowait(None)
        try:
            await asyncio.wait_for(self.reader, 30)
        except (TimeoutError, grpc.aio.AioRpcError):
            self.reader.cancel()


async def _own_stream(channel: grpc.aio.Channel, case: Case, timeout: float) -> tuple[str | None, str, str]:
    """A fresh PushSamples stream: (hello,) the frame, the probe. -> (first ack, its reason, code)."""
    call = channel.stream_stream(TRAINER + "PushSamples", **_raw,
                                 response_deserializer=trainer_pb.PushSamplesResponse.FromString)(timeout=timeout)
    hello = trainer_pb.PushSamplesRequest(hello=trainer_pb.PushSamplesHello(producer_id=f"fuzz-{case.index}"))
    ack = reason = None
    try:
        if case.channel == "first":  # the frame is the hello: its answer (or the call's end) first, so
            await call.write(case.frame)  # nothing is written into a call the server already ended
            if await call.read() is grpc.aio.EOF:
                return None, "", (await call.code()).name
        for msg in [hello.SerializeToString(), case.frame] if case.channel == "frame" else []:
            await call.write(msg)
        await call.write(PROBE)
        while (resp := await call.read()) is not grpc.aio.EOF:
            for a in resp.acks:
                if a.sample_id == PROBE_ID:
                    await call.done_writing()  # the frame was read: the server must end the stream OK
                elif ack is None:
                    ack, reason = OUTCOMES[a.outcome], a.reason
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        pass  # the server ended the call: its code says how
    return ack, reason or "", (await call.code()).name


async def _unary(channel: grpc.aio.Channel, case: Case, timeout: float) -> str:
    try:
        if case.method.endswith("/WatchPolicy"):
            call = channel.unary_stream(case.method, **_raw)(case.frame, timeout=timeout)
            await call.read()  # the current version at once; then let go
            call.cancel()
        else:
            await channel.unary_unary(case.method, **_raw)(case.frame, timeout=timeout)
        return "OK"
    except grpc.aio.AioRpcError as exc:
        return exc.code().name


async def fuzz(trainer_port: int, rollout_port: int, cases: FuzzCases, n: int, *, concurrency: int = 8,
               call_timeout_s: float = 30.0, train_timeout_s: float = 300.0) -> FuzzReport:
    """Run n cases (see the module doc); waits until every valid sample is settled."""
    report, started = FuzzReport(), time.monotonic()
    limit = cases.max_message_bytes + (1 << 20)  # our own frames over the server's limit must leave
    opts = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
    trainer_ch = grpc.aio.insecure_channel(f"127.0.0.1:{trainer_port}", options=opts)
    rollout_ch = grpc.aio.insecure_channel(f"127.0.0.1:{rollout_port}", options=opts)
    main = MainStream(trainer_ch)
    slots = asyncio.Semaphore(concurrency)
    pending: set[asyncio.Task] = set()
    await main.wait(main.first.is_set, call_timeout_s, "the first response")

    async def side(case: Case) -> None:
        try:
            if case.kind == "resend":  # only once the original was received (else it is not a re-send)
                await main.wait(lambda: main.acks.get(case.sample_id), train_timeout_s, "the original's ack")
            if case.channel == "unary":
                channel = rollout_ch if case.method.startswith("/agrpo.v1.RolloutService/") else trainer_ch
                _record(report, case, None, "", await _unary(channel, case, call_timeout_s))
            else:
                _record(report, case, *await _own_stream(trainer_ch, case, call_timeout_s))
        except Exception as exc:  # noqa: BLE001 - reported as this case's failure
            report.got[case.index] = f"ERROR {type(exc).__name__}"
            report.failures.append(f"{case.kind} #{case.index}: {exc!r}")
        finally:
            slots.release()

    main_cases: list[Case] = []
    try:
        for _ in range(n):
            case = cases.next_case(main.version)
            report.cases[case.index] = case
            if case.channel == "sample":
                await main.send(case.sample, train_timeout_s)
                main_cases.append(case)
            else:
                await slots.acquire()
                task = asyncio.create_task(side(case))
                pending.add(task)
                task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
        await _settle(main, main_cases, report, train_timeout_s)
    finally:
        await main.close()
        await trainer_ch.close()
        await rollout_ch.close()
    report.seconds = time.monotonic() - started
    return report


async def _settle(main: MainStream, main_cases: list[Case], report: FuzzReport, timeout: float) -> None:
    """Wait for every main-stream sample's final ack, then judge them (ids are unique, except
    the empty id, whose acks are REJECTED in the order sent)."""
    def final(case: Case) -> bool:
        acks = main.acks.get(case.sample_id, [])
        return bool(acks) and (acks[-1][0] != "ACCEPTED" or "ACCEPTED" in case.acks)

    try:
        await main.wait(lambda: all(final(c) for c in main_cases), timeout, "every sample's final ack")
    except TimeoutError as exc:
        report.failures.append(str(exc))
    empty = iter(main.acks.get("", []))
    for case in main_cases:
        if case.sample_id == "":
            outcome, reason = next(empty, ("MISSING", ""))
        else:
            acks = main.acks.get(case.sample_id) or [("MISSING", "")]
            outcome, reason = acks[-1]
            if len(acks) > 2 or (len(acks) == 2 and acks[0][0] != "ACCEPTED"):
                report.failures.append(f"{case.kind} #{case.index}: acks {[a for a, _ in acks]}")
        _record(report, case, outcome, reason, None)


def _record(report: FuzzReport, case: Case, ack: str | None, reason: str, code: str | None) -> None:
    report.got[case.index] = ack or code or "NONE"
    problems = []
    if case.acks and ack not in case.acks:
        problems.append(f"ack {ack}, expected one of {sorted(case.acks)}")
    if not case.acks and ack is not None:
        problems.append(f"unexpected ack {ack}")
    if case.codes and code not in case.codes:
        problems.append(f"status {code}, expected one of {sorted(case.codes)}")
    if case.reason and ack in ("REJECTED", "DROPPED_STALE") and case.reason not in reason:
        problems.append(f"reason {reason[:120]!r} does not name {case.reason!r}")
    if problems:
        report.failures.append(f"{case.kind} #{case.index}: " + "; ".join(problems))


async def start_rollout_rpcs(cfg):
    """The rollout's gRPC server only: RolloutService over a RolloutApp that is not set up (no
    vLLM, data or peers), so its servicer, health and interceptors are real, its status empty."""
    from agrpo.services.rollout.server import RolloutService

    svc = RolloutService(cfg)
    svc.port = await svc.grpc_server.start()
    await svc.grpc_server.set_serving(True)
    return svc


@contextlib.asynccontextmanager
async def fuzz_targets(trainer_cfg, rollout_cfg):
    """A started trainer service and the rollout's gRPC server, plus a `FuzzCases` factory
    bound to the trainer's vocabulary and token budget; both are stopped on exit."""
    from agrpo.services.trainer.server import build

    svc = await build(trainer_cfg)
    await svc.start()
    rollout = await start_rollout_rpcs(rollout_cfg)
    try:
        loop = svc.app.loop
        yield svc, rollout, functools.partial(FuzzCases, vocab_size=loop.vocab_size(), max_tokens=loop.token_budget())
    finally:
        await rollout.stop()
        await svc.stop()


async def serving(port: int, service: str) -> bool:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                          timeout=10)
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def trained_problems(reports: list[FuzzReport], app, output_dir) -> list[str]:
    """Why what the trainer trained is not exactly the valid samples (empty: it is): the audit
    log, the ledger and GetStatus's count agree, hold every valid main-stream sample and no
    id of invalid content, and the weights are finite."""
    import json

    import torch

    must = set().union(*(r.must_train() for r in reports))
    may = set().union(*(r.may_train() for r in reports))
    path = output_dir / "trained_samples.jsonl"
    audit = [json.loads(line)["sample_id"] for line in path.read_text().splitlines()] if path.exists() else []
    problems = []
    if len(audit) != len(set(audit)):
        problems.append(f"{len(audit) - len(set(audit))} sample ids trained twice")
    if missing := must - set(audit):
        problems.append(f"{len(missing)} valid samples not trained, e.g. {sorted(missing)[:3]}")
    if intruders := set(audit) - may:
        problems.append(f"{len(intruders)} invalid samples trained, e.g. {[i[:60] for i in sorted(intruders)[:3]]}")
    if set(app.state.ledger.trained_ids) != set(audit):
        problems.append("the ledger and the audit log differ")
    if not all(torch.isfinite(p).all() for p in app.loop.engine.model.parameters()):
        problems.append("weights are not finite")
    return problems
