"""What a step is (services/trainer/gathering.py): samples_per_step samples whatever the token budget,
cut into as many micro-batches as the budget needs; smaller only at the run's tail."""

from __future__ import annotations

import asyncio

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.metrics import IdleClock
from agrpo.services.trainer.app import build_pace
from agrpo.services.trainer.buffer import SampleBuffer
from agrpo.services.trainer.gathering import StepGatherer
from agrpo.services.trainer.intake import Intake
from agrpo.services.trainer.ledger import Ledger
from agrpo.services.trainer.metrics import TrainerMetrics
from agrpo.services.trainer.state import TrainState


def _gatherer(cfg: AgrpoConfig, prompts_per_epoch: int = 0) -> StepGatherer:
    state = TrainState(ledger=Ledger(prompts_per_epoch))
    buffer = SampleBuffer(cfg.queue_maxsize)
    intake = Intake(buffer, state.ledger, build_pace(cfg))

    async def reconcile() -> None:
        return None

    gatherer = StepGatherer(cfg, state, buffer, intake, TrainerMetrics(), 1, IdleClock(), lambda: 64, reconcile)
    gatherer.start()
    return gatherer


def _fill(gatherer: StepGatherer, make_sample, groups: int, size: int, tokens: int = 20) -> None:
    for g in range(groups):
        for k in range(size):
            gatherer.buffer.put(make_sample(f"g{g}s{k}", f"g{g}", [1, 2, 3], [4 + k] * tokens, key=(g, 0), size=size))


async def test_a_step_is_the_batch_asked_for_in_as_many_micro_batches_as_the_budget_needs(make_sample):
    """16 samples a step (8 x GA 2 x 1 rank, groups of 4) of 23 tokens in rows of at most 64 tokens:
    every step trains 16 samples, in several micro-batches, and leaves the rest buffered."""
    cfg = AgrpoConfig(per_device_train_batch_size=8, gradient_accumulation_steps=2, num_generations=4,
                      token_budget=64, max_steps=10, trainer={"idle_flush_s": None})
    gatherer = _gatherer(cfg)
    _fill(gatherer, make_sample, groups=10, size=4)
    first = await asyncio.wait_for(gatherer.pull(asyncio.Event()), 5)
    second = await asyncio.wait_for(gatherer.pull(asyncio.Event()), 5)
    for step in (first, second):
        assert len(step.samples) == 16 and len(step.batches) > 2
        assert all(row.num_tokens <= 64 for mb in step.batches for row in mb.rows)
        assert len({s.group_id for s in step.samples}) == 4  # whole groups
    assert len(gatherer.buffer) == 8
    for step in (first, second):
        gatherer.ledger.record(step.samples)
    stop = asyncio.Event()
    third = asyncio.create_task(gatherer.pull(stop))
    await asyncio.sleep(0.3)
    assert not third.done()  # 8 buffered are half a step: it waits for the rest, never trains a partial step
    stop.set()
    assert await asyncio.wait_for(third, 5) is None


async def test_the_runs_last_step_trains_what_the_run_has_left(make_sample):
    """One epoch of 5 prompts at 2 groups a step: the third step is the one group left, and the
    epoch is then complete."""
    cfg = AgrpoConfig(per_device_train_batch_size=8, num_generations=4, token_budget=0, num_train_epochs=1,
                      max_steps=-1, trainer={"idle_flush_s": None})
    gatherer = _gatherer(cfg, prompts_per_epoch=5)
    _fill(gatherer, make_sample, groups=5, size=4)
    sizes = []
    for _ in range(3):
        step = await asyncio.wait_for(gatherer.pull(asyncio.Event()), 5)
        gatherer.ledger.record(step.samples)
        sizes.append(len(step.samples))
    assert sizes == [8, 8, 4] and gatherer.ledger.reached(1)
