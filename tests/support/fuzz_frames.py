"""The fuzz kinds that travel as raw bytes (tests/support/fuzz_samples.py's module doc):
frames after a valid hello, first messages of a stream, and status/heartbeat requests.
Imported by fuzz_samples.py, whose KINDS they join (after its own, so a seed draws the same cases).
"""

from __future__ import annotations

import math
import struct

from google.protobuf.message import DecodeError

from agrpo.v1 import common_pb2 as pb
from agrpo.v1 import trainer_service_pb2 as trainer_pb
from fuzz_samples import MAX_ID_CHARS, REQUEST_TYPES, UINT64_MAX, Case, FuzzCases, _as_request, _field, _varint, kind


# Raw frames after a valid hello.
@kind("frame_random", 4)
def _frame_random(g: FuzzCases, rng, i, version) -> Case:
    return g._frame_case(i, "frame_random", rng.randbytes(rng.choice([1, 2, 5, 16, 64, 256])), version)


@kind("frame_mutated", 6)
def _frame_mutated(g: FuzzCases, rng, i, version) -> Case:
    base = g.valid_sample(rng, 1_000_000 + i, version, key=(1_000_000 + i, 1), prefix="mut")
    data = bytearray(_as_request(base.SerializeToString()))
    for _ in range(rng.randint(1, 4)):
        op, at = rng.randrange(4), rng.randrange(len(data))
        if op == 0:
            data[at] = rng.randrange(256)
        elif op == 1:
            data.insert(at, rng.randrange(256))
        elif op == 2 and len(data) > 1:
            del data[at]
        else:
            data = data[:at]
        if not data:
            data = bytearray(b"\x12")
    return g._frame_case(i, "frame_mutated", bytes(data), version)


@kind("frame_bad_utf8", 2)
def _frame_bad_utf8(g: FuzzCases, rng, i, version) -> Case:
    bad = rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"ok\x80"])
    s = g.valid_sample(rng, i, version, key=(i, 4), prefix="utf8").SerializeToString()
    where = rng.randrange(4)
    if where == 0:
        extra = _field(1, 2, bad)  # sample_id (a later occurrence wins)
    elif where == 1:
        extra = _field(2, 2, bad)  # group_id
    elif where == 2:
        extra = _field(12, 2, _field(1, 2, bad) + _field(2, 5, struct.pack("<f", 1.0)))  # a reward_components key
    else:
        extra = _field(16, 2, bad)  # prompt_text
    return g._frame_case(i, "frame_bad_utf8", _as_request(s + extra), version)


@kind("frame_corrupt", 2)
def _frame_corrupt(g: FuzzCases, rng, i, version) -> Case:
    """Wire-format errors: truncated varint, length past the end, bad packed floats, group tags."""
    s = g.valid_sample(rng, i, version, key=(i, 5), prefix="corrupt").SerializeToString()
    choice = rng.randrange(5)
    if choice == 0:
        frame = _as_request(s + b"\x30\xff\xff")  # input_ids varint cut short
    elif choice == 1:
        frame = _as_request(s)[:-rng.randint(1, 3)]  # sample shorter than its length says
    elif choice == 2:
        frame = _as_request(s + _field(8, 2, b"\x00" * rng.choice([1, 2, 3, 5])))  # packed floats, not x4
    elif choice == 3:
        frame = _as_request(s) + b"\x0c"  # an end-group tag with no group
    else:
        frame = b"\x12" + _varint(1 << 40) + s  # a length of 1 TiB
    return g._frame_case(i, "frame_corrupt", frame, version)


@kind("frame_negative_varint", 2)
def _frame_negative_varint(g: FuzzCases, rng, i, version) -> Case:
    """uint32 fields written as negative int64 varints (as a C++ client casting -1 would)."""
    s = g.valid_sample(rng, i, version, key=(i, 6), prefix="neg")
    data = s.SerializeToString()
    number = rng.choice([6, 7, 9])  # input_ids, completion_mask, prompt_length
    frame = _as_request(data + _field(number, 0, -rng.randint(1, 1 << 31)))
    return g._frame_case(i, "frame_negative_varint", frame, version)


@kind("frame_oversized", 0.3)
def _frame_oversized(g: FuzzCases, rng, i, version) -> Case:
    size = g.max_message_bytes + rng.choice([1, 1000, 65536])
    payload = _field(16, 2, b"a" * size)  # a sample whose prompt_text alone is over the limit
    return g._frame_case(i, "frame_oversized", _as_request(payload), version)


@kind("frame_other_payload", 1)
def _frame_other_payload(g: FuzzCases, rng, i, version) -> Case:
    msg = rng.choice([
        trainer_pb.PushSamplesRequest(),
        trainer_pb.PushSamplesRequest(hello=trainer_pb.PushSamplesHello(producer_id=f"again-{i}",
                                                                        prompts_per_epoch=rng.randrange(1 << 62))),
        trainer_pb.PushSamplesRequest(heartbeat=pb.HeartbeatRequest(
            sender=pb.ServiceInfo(service="x" * 1000, state=rng.randrange(1 << 30), uptime_s=math.nan),
            policy_version=UINT64_MAX)),
    ])
    return g._frame_case(i, "frame_other_payload", msg.SerializeToString(), version)


# First messages of a stream.
@kind("first_not_hello", 2)
def _first_not_hello(g: FuzzCases, rng, i, version) -> Case:
    choice = rng.randrange(4)
    if choice == 0:
        frame = trainer_pb.PushSamplesRequest(sample=g.valid_sample(rng, i, version, key=(i, 7),
                                                                    prefix="first")).SerializeToString()
    elif choice == 1:
        frame = b""
    elif choice == 2:
        frame = trainer_pb.PushSamplesRequest(heartbeat=pb.HeartbeatRequest()).SerializeToString()
    else:  # a hello whose producer id is too long to be a key
        frame = trainer_pb.PushSamplesRequest(hello=trainer_pb.PushSamplesHello(
            producer_id="p" * rng.choice([MAX_ID_CHARS + 1, 100_000]))).SerializeToString()
    return g._frame_case(i, "first_not_hello", frame, version, channel="first")


@kind("first_random", 2)
def _first_random(g: FuzzCases, rng, i, version) -> Case:
    if rng.random() < 0.5:
        frame = rng.randbytes(rng.choice([1, 3, 16, 100]))
    else:  # a hello with a byte or two changed
        data = bytearray(trainer_pb.PushSamplesRequest(hello=trainer_pb.PushSamplesHello(
            producer_id=f"firstrand-{i}")).SerializeToString())
        for _ in range(rng.randint(1, 2)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        frame = bytes(data)
    return g._frame_case(i, "first_random", frame, version, channel="first")


# Status and heartbeat RPCs (trainer and rollout).
@kind("unary_random", 3)
def _unary_random(g: FuzzCases, rng, i, version) -> Case:
    method = rng.choice(sorted(REQUEST_TYPES))
    frame = rng.randbytes(rng.choice([0, 1, 2, 8, 64, 512]))
    return _unary_case(g, i, "unary_random", method, frame)


@kind("unary_weird", 2)
def _unary_weird(g: FuzzCases, rng, i, version) -> Case:
    """Valid requests with extreme field values (huge strings, unknown enums, odd timestamps),
    bad UTF-8, unknown fields, or over the size limit."""
    method = rng.choice(sorted(REQUEST_TYPES))
    choice = rng.randrange(5)
    if choice == 0:
        frame = pb.HeartbeatRequest(
            sender=pb.ServiceInfo(service="s" * 10_000, instance_id="é" * 100, version="\u0000",
                                  state=rng.randrange(1 << 31), uptime_s=rng.choice([math.nan, -math.inf, 1e308])),
            policy_version=UINT64_MAX,
            sent_at={"seconds": rng.choice([-(1 << 63), (1 << 63) - 1]), "nanos": -1}).SerializeToString()
    elif choice == 1:
        frame = _field(1, 2, _field(1, 2, b"\xff\xfe"))  # sender.service with bad UTF-8
    elif choice == 2:
        frame = _field(999, 2, rng.randbytes(100)) + _field(5000, 0, UINT64_MAX)  # unknown fields only
    elif choice == 3:
        frame = _field(1, 2, rng.randbytes(rng.randrange(1, 50)))
    else:
        frame = _field(1, 2, b"w" * (g.max_message_bytes + 10))
    return _unary_case(g, i, "unary_weird", method, frame)


def _unary_case(g: FuzzCases, i: int, kind_name: str, method: str, frame: bytes) -> Case:
    if len(frame) > g.max_message_bytes:
        code = "RESOURCE_EXHAUSTED"
    else:
        try:
            REQUEST_TYPES[method].FromString(frame)
            code = "OK"
        except DecodeError:
            code = "INVALID_ARGUMENT"
    return Case(i, kind_name, "unary", frame=frame, method=method, codes=frozenset({code}))
