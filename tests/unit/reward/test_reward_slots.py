"""Admission slots (services/reward/admission.py): refuse, wait, hand over, pace."""

from __future__ import annotations

import asyncio

import pytest

from agrpo.services.common.errors import ResourceExhausted
from agrpo.services.reward.admission import Admission


def test_refused_when_full_and_when_the_deadline_cannot_be_met():
    slots = Admission(capacity=2, num_workers=1)
    with slots.admit(None), slots.admit(None), pytest.raises(ResourceExhausted), slots.admit(None):
        pass
    assert slots.admitted == 0
    slots.observe(1.0)  # one worker busy 1 s per request: 1 s apart
    with slots.admit(10.0):
        with pytest.raises(ResourceExhausted, match="deadline"), slots.admit(2.0):  # done in ~2 s, past 80% of 2 s
            pass
        with slots.admit(3.0):
            assert slots.admitted == 2


async def test_waiters_get_slots_in_order_and_block_refusable_callers():
    slots = Admission(capacity=1, num_workers=1)
    await slots.wait_for_slot()
    order: list[str] = []

    async def waiter(name: str) -> None:
        await slots.wait_for_slot()
        order.append(name)

    tasks = [asyncio.create_task(waiter(n)) for n in ("a", "b", "c")]
    await asyncio.sleep(0)
    tasks[1].cancel()  # a cancelled waiter gives up its place
    await asyncio.sleep(0)
    with pytest.raises(ResourceExhausted), slots.admit(None):  # waiters are ahead of unary callers
        pass
    for _ in range(3):
        slots.release()
        await asyncio.sleep(0)
    assert order == ["a", "c"] and slots.admitted == 0
