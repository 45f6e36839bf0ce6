"""Malformed trainer and rollout RPC traffic: a pure, seeded fuzz-case generator.

`FuzzCases(seed, vocab_size, max_tokens, max_message_bytes)` builds a mix of valid samples
and malformed traffic of every kind in `KINDS`; `next_case(version)` draws the next case
against the trainer's current policy version (so the same seed and versions give the same
cases). The kinds sent as raw bytes live in fuzz_frames.py. No gRPC and no I/O here:
tests/support/fuzz_driver.py sends the cases.

Where a case goes (`channel`):
    sample  a RolloutSample on the main PushSamples stream (after its hello, under credit)
    frame   raw bytes as the second message of a fresh stream (after a valid hello)
    first   raw bytes as the first message of a fresh stream
    unary   raw bytes as the request of a status/heartbeat RPC (`method`)

What must happen (`acks`, `codes`): the sample's acks (main stream: its final ack; a fresh
stream: its first ack; empty: no ack at all) and, for fresh streams and unary calls, the
status code the call ends with. `reason` is a word the ack's reason must contain. Random
frames that happen to decode are judged by `verdict`, the admission rule written out
independently of services/trainer/sample.py, so the fuzz is also a differential check.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from agrpo.v1 import common_pb2 as pb
from agrpo.v1 import trainer_service_pb2 as trainer_pb

MAX_ID_CHARS = 512
MAX_ABS_ADVANTAGE = 1e6
UINT32_MAX, UINT64_MAX = 2**32 - 1, 2**64 - 1
FAR = 1000
"""Versions this far past the trainer's are never reached during a run: certainly unpublished."""

TRAINER, ROLLOUT = "/agrpo.v1.TrainerService/", "/agrpo.v1.RolloutService/"
REQUEST_TYPES = {
    TRAINER + "Heartbeat": pb.HeartbeatRequest, TRAINER + "GetStatus": pb.GetStatusRequest,
    TRAINER + "GetResumePoint": trainer_pb.GetResumePointRequest,
    TRAINER + "WatchPolicy": trainer_pb.WatchPolicyRequest,
    ROLLOUT + "Heartbeat": pb.HeartbeatRequest, ROLLOUT + "GetStatus": pb.GetStatusRequest,
}
BUFFER_FULL = "REJECTED"  # a content-valid sample on a stream without credit may find the buffer full


@dataclass(frozen=True)
class Case:
    """One fuzz input and what the server must do with it."""

    index: int
    kind: str
    channel: str
    sample: pb.RolloutSample | None = None
    frame: bytes = b""
    method: str = ""
    acks: frozenset[str] = frozenset()
    codes: frozenset[str] = frozenset()
    reason: str = ""
    may_train: bool = False
    """Its sample id may end up trained (valid content); every other id must never be."""

    @property
    def sample_id(self) -> str | None:
        return self.sample.sample_id if self.sample is not None else None


def verdict(s: pb.RolloutSample, vocab_size: int, max_tokens: int | None) -> str | None:
    """The word naming why a sample must be REJECTED, or None when its content is trainable."""
    n = len(s.input_ids)
    if not s.sample_id or len(s.sample_id) > MAX_ID_CHARS:
        return "sample_id"
    if len(s.group_id) > MAX_ID_CHARS:
        return "group_id"
    if n == 0:
        return "input_ids"
    if len(s.completion_mask) != n or len(s.behavior_logprobs) != n:
        return "length mismatch"
    if max(s.input_ids) >= vocab_size:
        return "token id"
    if any(m > 1 for m in s.completion_mask):
        return "completion_mask"
    trained = [p for p in range(1, n) if s.completion_mask[p]]
    if not trained:
        return "no trained token"
    if s.prompt_length > n:
        return "prompt_length"
    if any(not math.isfinite(s.behavior_logprobs[p]) or s.behavior_logprobs[p] > 0 for p in trained):
        return "behavior_logprobs"
    if not math.isfinite(s.advantage) or abs(s.advantage) > MAX_ABS_ADVANTAGE:
        return "advantage"
    if any(sp.start >= sp.end or sp.end > n for sp in s.version_spans):
        return "version span"
    if s.version_spans and s.policy_version > min(sp.policy_version for sp in s.version_spans):
        return "policy_version"
    if max_tokens and n > max_tokens:
        return "oversize"
    return None


def newest_version(s: pb.RolloutSample) -> int:
    return max([s.policy_version, *(sp.policy_version for sp in s.version_spans)])


# Raw protobuf encoding, for frames a protobuf client would refuse to build.
def _varint(v: int) -> bytes:
    v &= UINT64_MAX  # negative ints encode as 10-byte two's complement, as int64 does
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    tag = _varint(number << 3 | wire)
    if wire == 0:
        return tag + _varint(payload)
    return tag + (_varint(len(payload)) + payload if wire == 2 else payload)


def _as_request(sample_bytes: bytes) -> bytes:
    """PushSamplesRequest{sample: <sample_bytes>}."""
    return _field(2, 2, sample_bytes)


@dataclass
class FuzzCases:
    """Seeded stream of fuzz cases; `next_case(version)` draws one (see the module doc)."""

    seed: int
    vocab_size: int
    max_tokens: int | None = 512
    max_message_bytes: int = 1 << 20
    weights: dict[str, float] | None = None
    count: int = 0
    valid_sent: list[pb.RolloutSample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        table = {name: w for name, (w, _) in KINDS.items()}
        table.update(self.weights or {})
        self._names = [k for k, w in table.items() if w > 0]
        self._cum = []
        total = 0.0
        for k in self._names:
            total += table[k]
            self._cum.append(total)

    def next_case(self, version: int, kind: str | None = None) -> Case:
        """The next case (of `kind`, else a weighted draw) against trainer version `version`."""
        i, self.count = self.count, self.count + 1
        rng = random.Random(f"{self.seed}:{i}")
        if kind is None:
            kind = self._names[_bisect(self._cum, self.rng.random() * self._cum[-1])]
        case = KINDS[kind][1](self, rng, i, version)
        if kind in ("valid", "valid_edge"):
            self.valid_sent.append(case.sample)
        return case

    # Building blocks
    def valid_sample(self, rng: random.Random, i: int, version: int, key: tuple[int, int] | None = None,
                     prefix: str = "ok") -> pb.RolloutSample:
        """A well-formed row: a prompt, 2-8 trained tokens, plausible logprobs, a span."""
        p, c = rng.randint(1, 8), rng.randint(2, 8)
        n = p + c
        spans = [pb.VersionSpan(policy_version=version, start=p, end=n)] if rng.random() < 0.5 else []
        dataset_index, epoch = key if key is not None else (i, 0)
        return pb.RolloutSample(
            sample_id=f"{prefix}-{i}", group_id=f"{prefix}-g{i}",
            prompt_key=pb.PromptKey(dataset_index=dataset_index, epoch=epoch), policy_version=version,
            version_spans=spans, input_ids=[rng.randrange(self.vocab_size) for _ in range(n)],
            completion_mask=[0] * p + [1] * c,
            behavior_logprobs=[0.0] * p + [-rng.uniform(0.01, 8.0) for _ in range(c)],
            prompt_length=p, advantage=rng.uniform(-2, 2), reward=rng.random())

    def bad_sample(self, rng: random.Random, i: int, version: int, kind: str) -> pb.RolloutSample:
        """A valid row of its own id and prompt key (epoch 2), to be broken by the caller."""
        return self.valid_sample(rng, i, version, key=(i, 2), prefix=f"bad-{kind}")

    def judge(self, s: pb.RolloutSample, version: int) -> tuple[frozenset[str], bool]:
        """Allowed first acks of a decoded sample, and whether it may train (see verdict)."""
        word = verdict(s, self.vocab_size, None)
        if word is not None:
            return frozenset({"REJECTED"}), False
        newest = newest_version(s)
        acks: set[str] = set()
        if newest > version:
            acks.add("DROPPED_STALE")
            if newest >= version + FAR:
                return frozenset(acks), False
        oversize = bool(self.max_tokens) and len(s.input_ids) > self.max_tokens
        acks |= {"REJECTED"} if oversize else {"ACCEPTED", "DUPLICATE", BUFFER_FULL}
        return frozenset(acks), not oversize

    def _rejected(self, i: int, kind: str, s: pb.RolloutSample, word: str) -> Case:
        got = verdict(s, self.vocab_size, self.max_tokens)
        assert got == word, (kind, got, word)  # the generator built what it meant to
        return Case(i, kind, "sample", sample=s, acks=frozenset({"REJECTED"}), reason=word)

    def _frame_case(self, i: int, kind: str, frame: bytes, version: int, channel: str = "frame") -> Case:
        """Expectations of raw bytes after a hello, from what they decode to."""
        if len(frame) > self.max_message_bytes:
            return Case(i, kind, channel, frame=frame, codes=frozenset({"RESOURCE_EXHAUSTED"}))
        try:
            msg = trainer_pb.PushSamplesRequest.FromString(frame)
        except DecodeError:
            return Case(i, kind, channel, frame=frame, codes=frozenset({"INVALID_ARGUMENT"}))
        payload = msg.WhichOneof("payload")
        if channel == "first":
            ok = payload == "hello" and len(msg.hello.producer_id) <= MAX_ID_CHARS
            return Case(i, kind, channel, frame=frame, codes=frozenset({"OK" if ok else "INVALID_ARGUMENT"}))
        if payload != "sample":  # a second hello, a heartbeat, nothing: ignored
            return Case(i, kind, channel, frame=frame, codes=frozenset({"OK"}))
        acks, may_train = self.judge(msg.sample, version)
        return Case(i, kind, channel, sample=msg.sample, frame=frame, acks=acks, codes=frozenset({"OK"}),
                    may_train=may_train)


def _bisect(cum: list[float], x: float) -> int:
    lo, hi = 0, len(cum) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cum[mid] > x:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _trained_positions(s: pb.RolloutSample) -> list[int]:
    return [p for p in range(1, len(s.input_ids)) if s.completion_mask[p]]


Builder = Callable[[FuzzCases, random.Random, int, int], Case]
KINDS: dict[str, tuple[float, Builder]] = {}


def kind(name: str, weight: float) -> Callable[[Builder], Builder]:
    def register(fn: Builder) -> Builder:
        KINDS[name] = (weight, fn)
        return fn
    return register


# Valid traffic: must train.
@kind("valid", 4)
def _valid(g: FuzzCases, rng, i, version) -> Case:
    return Case(i, "valid", "sample", sample=g.valid_sample(rng, i, version), acks=frozenset({"TRAINED"}),
                may_train=True)


@kind("valid_edge", 2)
def _valid_edge(g: FuzzCases, rng, i, version) -> Case:
    """Valid but at the edges: boundary ids and advantages, NaN rewards and metrics, 0.0 and
    -1e30 logprobs, NaN logprobs where nothing is trained, prompt_length 0 or n, huge keys."""
    s = g.valid_sample(rng, i, version, prefix="edge")
    n, trained = len(s.input_ids), _trained_positions(s)
    edit = rng.randrange(8)
    if edit == 0:
        s.input_ids[rng.randrange(n)] = rng.choice([0, g.vocab_size - 1])
        s.advantage = rng.choice([MAX_ABS_ADVANTAGE, -MAX_ABS_ADVANTAGE, 0.0])
    elif edit == 1:
        s.reward = rng.choice([math.nan, math.inf, -math.inf, 3e38])
        s.reward_components.update({"f": math.nan, "g": -math.inf, "ü" * 8: 1e30})
        s.metrics.update({"reward_std": math.nan, "x": math.inf, "y": 1.7e308})
        s.reward_errors["f"] = "timed out " * 5
    elif edit == 2:
        s.behavior_logprobs[trained[0]] = rng.choice([0.0, -0.0, -1e30, -3.4e38])
    elif edit == 3:  # masked tokens keep whatever logprob they had: nothing trains on them
        s.behavior_logprobs[0] = math.nan
        s.completion_mask[0] = rng.choice([0, 1])  # position 0 is never a loss term
    elif edit == 4:
        s.prompt_length = rng.choice([0, n])
    elif edit == 5:
        s.prompt_key.dataset_index, s.prompt_key.epoch = UINT64_MAX - i, UINT32_MAX - rng.randrange(4)
    elif edit == 6:
        s.group_id, s.sample_id = "g" * MAX_ID_CHARS, f"edge-{i}-".ljust(MAX_ID_CHARS, "é")
    else:
        s.prompt_text, s.completion_text = "\u0000\ud7ff" * 50, "😀" * 100
        del s.version_spans[:]
        s.version_spans.add(policy_version=version, start=0, end=n)
    return Case(i, "valid_edge", "sample", sample=s, acks=frozenset({"TRAINED"}), may_train=True)


# Malformed samples: REJECTED, naming the problem.
@kind("length_mismatch", 3)
def _length_mismatch(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "length")
    target = rng.choice([s.completion_mask, s.behavior_logprobs])
    if rng.random() < 0.5 and len(target):
        del target[rng.randrange(len(target))]
    else:
        extra = rng.choice([1, 2, 1000, 100_000])
        target.extend([0] * extra if target is s.completion_mask else [-1.0] * extra)
    return g._rejected(i, "length_mismatch", s, "length mismatch")


@kind("empty_input_ids", 1)
def _empty_input_ids(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "empty")
    del s.input_ids[:], s.completion_mask[:], s.behavior_logprobs[:], s.version_spans[:]
    s.prompt_length = 0
    return g._rejected(i, "empty_input_ids", s, "input_ids")


@kind("empty_sample", 1)
def _empty_sample(g: FuzzCases, rng, i, version) -> Case:
    return g._rejected(i, "empty_sample", pb.RolloutSample(), "sample_id")


@kind("empty_sample_id", 1)
def _empty_sample_id(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "noid")
    s.sample_id = ""
    return g._rejected(i, "empty_sample_id", s, "sample_id")


@kind("huge_id", 2)
def _huge_id(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "hugeid")
    size = rng.choice([MAX_ID_CHARS + 1, 4096, 200_000])
    if rng.random() < 0.5:
        s.sample_id = f"bad-hugeid-{i}-".ljust(size, "x")
        return g._rejected(i, "huge_id", s, "sample_id")
    s.group_id = "g" * size
    return g._rejected(i, "huge_id", s, "group_id")


@kind("mask_not_binary", 2)
def _mask_not_binary(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "mask")
    s.completion_mask[rng.randrange(len(s.input_ids))] = rng.choice([2, 7, 255, UINT32_MAX])
    return g._rejected(i, "mask_not_binary", s, "completion_mask")


@kind("no_trained_token", 2)
def _no_trained_token(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "notrain")
    s.completion_mask[:] = [0] * len(s.input_ids)
    if rng.random() < 0.5:
        s.completion_mask[0] = 1  # position 0 has no context: still nothing to train
    return g._rejected(i, "no_trained_token", s, "no trained token")


@kind("logprob_not_finite", 3)
def _logprob_not_finite(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "lpnan")
    for p in rng.sample(_trained_positions(s), rng.randint(1, 2)):
        s.behavior_logprobs[p] = rng.choice([math.nan, math.inf, -math.inf])
    return g._rejected(i, "logprob_not_finite", s, "behavior_logprobs")


@kind("logprob_positive", 2)
def _logprob_positive(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "lppos")
    s.behavior_logprobs[rng.choice(_trained_positions(s))] = rng.choice([1e-7, 0.5, 3.0, 1e30])
    return g._rejected(i, "logprob_positive", s, "behavior_logprobs")


@kind("advantage_bad", 3)
def _advantage_bad(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "adv")
    s.advantage = rng.choice([math.nan, math.inf, -math.inf, 2e6, -1e20, 3.4e38])
    return g._rejected(i, "advantage_bad", s, "advantage")


@kind("token_out_of_vocab", 3)
def _token_out_of_vocab(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "vocab")
    s.input_ids[rng.randrange(len(s.input_ids))] = rng.choice(
        [g.vocab_size, g.vocab_size + rng.randrange(1, 1 << 20), UINT32_MAX])
    return g._rejected(i, "token_out_of_vocab", s, "token id")


@kind("prompt_length_bad", 2)
def _prompt_length_bad(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "plen")
    s.prompt_length = rng.choice([len(s.input_ids) + 1, 1 << 20, UINT32_MAX])
    return g._rejected(i, "prompt_length_bad", s, "prompt_length")


@kind("span_bad", 3)
def _span_bad(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "span")
    n = len(s.input_ids)
    start, end = rng.choice([(3, 3), (5, 2), (0, n + 1), (n, n + 5), (UINT32_MAX, UINT32_MAX),
                             (0, UINT32_MAX), (n + 10, n + 20)])
    s.version_spans.append(pb.VersionSpan(policy_version=version, start=start, end=end))
    return g._rejected(i, "span_bad", s, "version span")


@kind("version_header_newer", 1)
def _version_header_newer(g: FuzzCases, rng, i, version) -> Case:
    """policy_version must be the oldest version of the spans (the trainer judges staleness by it)."""
    s = g.bad_sample(rng, i, version, "header")
    del s.version_spans[:]
    s.version_spans.add(policy_version=version, start=s.prompt_length, end=len(s.input_ids))
    s.policy_version = version + rng.choice([1, FAR, UINT64_MAX - version])
    return g._rejected(i, "version_header_newer", s, "policy_version")


@kind("oversize", 1)
def _oversize(g: FuzzCases, rng, i, version) -> Case:
    s = g.bad_sample(rng, i, version, "big")
    n = rng.choice([(g.max_tokens or 512) + 1, 5000, 50_000])
    p = 4
    s.input_ids[:] = [rng.randrange(g.vocab_size) for _ in range(n)]
    s.completion_mask[:] = [0] * p + [1] * (n - p)
    s.behavior_logprobs[:] = [0.0] * p + [-1.0] * (n - p)
    s.prompt_length = p
    del s.version_spans[:]
    return g._rejected(i, "oversize", s, "oversize")


# Versions no trainer published: DROPPED_STALE (the producer re-issues the prompt).
@kind("version_unpublished", 2)
def _version_unpublished(g: FuzzCases, rng, i, version) -> Case:
    s = g.valid_sample(rng, i, version, key=(i, 3), prefix="ver")
    far = rng.choice([version + FAR, version + rng.randrange(FAR, 1 << 40), UINT64_MAX])
    if rng.random() < 0.5:
        s.policy_version, reason = far, "newer"
        del s.version_spans[:]  # with spans, a policy_version newer than theirs is malformed
    else:  # only one span claims the future: its oldest version is fine, its newest is not
        del s.version_spans[:]
        s.version_spans.add(policy_version=version, start=s.prompt_length, end=s.prompt_length + 1)
        s.version_spans.add(policy_version=far, start=s.prompt_length + 1, end=len(s.input_ids))
        reason = "published"
    return Case(i, "version_unpublished", "sample", sample=s, acks=frozenset({"DROPPED_STALE"}), reason=reason)


# Re-sends, on a stream of their own: a malformed copy of a valid sample is REJECTED, an
# exact copy is ACCEPTED again (still pending) or DUPLICATE (trained).
@kind("resend", 1)
def _resend(g: FuzzCases, rng, i, version) -> Case:
    if not g.valid_sent:
        return _valid(g, rng, i, version)
    s = pb.RolloutSample()
    s.CopyFrom(rng.choice(g.valid_sent))
    return Case(i, "resend", "frame", sample=s, frame=_as_request(s.SerializeToString()),
                acks=frozenset({"ACCEPTED", "DUPLICATE"}), codes=frozenset({"OK"}), may_train=True)


@kind("resend_malformed", 2)
def _resend_malformed(g: FuzzCases, rng, i, version) -> Case:
    if not g.valid_sent:
        return _valid(g, rng, i, version)
    s = pb.RolloutSample()
    s.CopyFrom(rng.choice(g.valid_sent))
    p = rng.choice(_trained_positions(s))
    edit = rng.randrange(4)
    if edit == 0:
        s.behavior_logprobs[p], word = math.nan, "behavior_logprobs"
    elif edit == 1:
        s.input_ids[p], word = g.vocab_size + 1, "token id"
    elif edit == 2:
        s.advantage, word = math.inf, "advantage"
    else:
        del s.completion_mask[-1]
        word = "length mismatch"
    assert verdict(s, g.vocab_size, g.max_tokens) == word
    return Case(i, "resend_malformed", "frame", sample=s, frame=_as_request(s.SerializeToString()),
                acks=frozenset({"REJECTED"}), codes=frozenset({"OK"}), reason=word, may_train=True)


# The raw-frame, first-message and unary kinds register after these, in the same order.
import fuzz_frames  # noqa: E402,F401  (registers its kinds in KINDS)
