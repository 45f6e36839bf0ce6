"""The Sender's bookkeeping of unsent samples (no stream: its queue and acks driven directly)."""

import grpc
import pytest

from agrpo.services.rollout.sender import Sender
from agrpo.v1 import common_pb2 as pb
from agrpo.v1 import trainer_service_pb2 as trainer_pb


class Hooks:
    """What the RolloutApp answers; groups of version <= `stale_below` are too stale."""

    def __init__(self):
        self.stale_below = -1
        self.done = []
        self.sent = []
        self.versions = []

    def is_stale(self, version):
        return version <= self.stale_below

    def on_group_done(self, key, ok, reason):
        self.done.append((key, ok, reason))

    def on_sent(self, sample):
        self.sent.append(sample.sample_id)

    def on_heard(self):
        pass

    def on_credits(self):
        pass

    def on_version(self, version, adapter=""):
        self.versions.append((version, adapter))


def group(index, version, size=4):
    gid = f"g{index}"
    return [pb.RolloutSample(sample_id=f"{gid}-{k}", group_id=gid, policy_version=version) for k in range(size)]


@pytest.fixture
async def sender():
    channel = grpc.aio.insecure_channel("127.0.0.1:9")  # never connected: no stream is opened
    yield Sender(channel, producer_id="test", prompts_per_epoch=8,
                 heartbeat_s=1.0, reconnect_s=1.0, hooks=Hooks())
    await channel.close()


def send(sender, n):
    out = []
    for _ in range(n):
        sample = sender._next_sendable()
        if sample is None:
            break
        sender.credits -= 1
        out.append(sample.sample_id)
    return out


def ack(sender, sample_ids, outcome=trainer_pb.SAMPLE_OUTCOME_TRAINED):
    sender._on_response(trainer_pb.PushSamplesResponse(
        acks=[trainer_pb.SampleAck(sample_id=sid, outcome=outcome) for sid in sample_ids]))


async def test_unsent_count_follows_sends_drops_and_acks(sender):
    for i, version in enumerate((1, 1, 2)):
        sender.add_group((i, 0), version, group(i, version))
    assert sender.unsent_count == 12
    sender.credits = 3
    assert send(sender, 5) == ["g0-0", "g0-1", "g0-2"]  # no credit, no send
    assert sender.unsent_count == 9
    sender.hooks.stale_below = 1  # g1 (not started) is now too stale; g0 has started
    assert sender.sweep_stale() == 1
    assert sender.unsent_count == 5 and sender.hooks.done == [((1, 0), False, "stale_buffered")]
    sender.credits = 10
    assert send(sender, 10) == ["g0-3", "g2-0", "g2-1", "g2-2", "g2-3"]
    assert sender.unsent_count == 0 and sender.held == 8
    ack(sender, [f"g0-{k}" for k in range(4)])
    assert sender.held == 4 and sender.hooks.done[-1] == ((0, 0), True, "trained")


async def test_a_group_finished_while_queued_for_resend_leaves_the_queue(sender):
    sender.add_group((0, 0), 1, group(0, 1))
    sender.credits = 4
    send(sender, 4)
    sender.unsent = type(sender.unsent).fromkeys(sender.samples)  # what a reconnect does
    assert sender.unsent_count == 4
    ack(sender, [f"g0-{k}" for k in range(4)], trainer_pb.SAMPLE_OUTCOME_DUPLICATE)
    assert sender.unsent_count == 0 and sender._next_sendable() is None


async def test_an_answer_names_the_served_adapter_with_the_credits_it_carries(sender):
    """Adapter-only LoRA sync: the credits a published version opens come with its adapter, so
    a request they pay for names it (not the older one a WatchPolicy stream may still hold)."""
    sender._on_response(trainer_pb.PushSamplesResponse(credits=4, policy_version=6, lora_adapter="agrpo-v5"))
    assert sender.hooks.versions == [(6, "agrpo-v5")] and sender.credits == 4
