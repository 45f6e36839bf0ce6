"""Admission rules for a pushed sample (Sample.validate via Intake), one case per rule, and
a differential check against tests/support/fuzz_samples.py's independent `verdict`."""

from __future__ import annotations

import math

import pytest

from agrpo.services.trainer.buffer import SampleBuffer
from agrpo.services.trainer.intake import Intake
from agrpo.services.trainer.ledger import Ledger
from agrpo.services.trainer.sample import MAX_ID_CHARS, Outcome
from agrpo.services.trainer.servicer import sample_from_proto
from fuzz_samples import FuzzCases, verdict
from trainer_helpers import Limits

VOCAB = 1024


def _break(s, rule: str) -> None:
    n = len(s.input_ids)
    if rule == "sample_id":
        s.sample_id = "x" * (MAX_ID_CHARS + 1)
    elif rule == "group_id":
        s.group_id = "g" * (MAX_ID_CHARS + 1)
    elif rule == "input_ids":
        s.input_ids, s.completion_mask, s.behavior_logprobs, s.version_spans = [], [], [], []
    elif rule == "length mismatch":
        s.behavior_logprobs.append(-1.0)
    elif rule == "token id":
        s.input_ids[-1] = VOCAB
    elif rule == "completion_mask":
        s.completion_mask[-1] = 2
    elif rule == "no trained token":
        s.completion_mask = [1] + [0] * (n - 1)  # position 0 is never a loss term
    elif rule == "prompt_length":
        s.prompt_length = n + 1
    elif rule == "behavior_logprobs":
        s.behavior_logprobs[-1] = 0.5
    elif rule == "advantage":
        s.advantage = math.nan
    elif rule == "version span":
        s.version_spans = [(0, n - 1, n + 1)]
    elif rule == "policy_version":
        s.version_spans, s.sent_version = [(0, n - 2, n)], 3


RULES = ["sample_id", "group_id", "input_ids", "length mismatch", "token id", "completion_mask",
         "no trained token", "prompt_length", "behavior_logprobs", "advantage", "version span",
         "policy_version"]


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_rejects_and_names_the_field(make_sample, rule):
    buf = SampleBuffer(4)
    intake = Intake(buf, Ledger())
    intake.bind_limits(Limits(vocab=VOCAB))
    stream = intake.open("p", 0)
    good = make_sample("a", "g", [1, 2, 3], [4, 5, 6])
    assert good.validate(VOCAB) is None
    bad = make_sample("a", "g", [1, 2, 3], [4, 5, 6])  # the same id as a pending sample
    _break(bad, rule)
    assert intake.receive(stream, good) is Outcome.ACCEPTED
    assert intake.receive(stream, bad) is Outcome.REJECTED
    acks = []
    while not stream.outbox.empty():
        acks += stream.outbox.get_nowait().acks
    ack = acks[-1]
    assert ack.outcome is Outcome.REJECTED and rule in ack.reason
    assert len(buf) == 1  # only the good one


def test_edges_that_are_valid(make_sample):
    s = make_sample("a", "g", [0, 1], [VOCAB - 1, 5])
    s.behavior_logprobs = [math.nan, math.inf, 0.0, -1e30]  # masked positions are never read
    s.advantage, s.reward, s.prompt_length = -1e6, math.inf, 4
    s.version_spans = [(2, 0, 4)]
    assert s.validate(VOCAB) is None
    s.completion_mask[0] = 1  # position 0 has no context: its logprob is never read either
    assert s.validate(VOCAB) is None
    assert s.validate(None) is None and make_sample("a", "g", [5000], [2]).validate(None) is None


def test_fuzz_cases_agree_with_the_independent_verdict():
    cases = FuzzCases(seed=3, vocab_size=VOCAB, max_tokens=512)  # size is the intake's check, not validate's
    checked = 0
    for i in range(1500):
        case = cases.next_case(version=i // 50)
        if case.sample is None:
            continue
        word = verdict(case.sample, VOCAB, None)
        problem = sample_from_proto(case.sample).validate(VOCAB)
        assert (problem is None) == (word is None), (case.kind, word, problem)
        if word is not None and case.channel == "sample":
            assert word in problem, (case.kind, word, problem)
        checked += 1
    assert checked > 700
