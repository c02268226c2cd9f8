"""The connection slots of a pool: never more holders than slots, waiters served in order, and no
slot lost to a waiter cancelled before or just after it was served."""

from __future__ import annotations

import asyncio

import pytest

from clonefleet.providers._slots import Slots

pytestmark = pytest.mark.timeout(10)


async def test_never_more_holders_than_slots_and_waiters_served_in_arrival_order():
    slots, holding, peak, order = Slots(3), 0, 0, []

    async def one(i: int) -> None:
        nonlocal holding, peak
        async with slots:
            order.append(i)
            holding += 1
            peak = max(peak, holding)
            await asyncio.sleep(0)
            holding -= 1

    await asyncio.gather(*(one(i) for i in range(200)))
    assert peak == 3 and order == list(range(200))
    assert slots.free == 3 and slots.waiting == 0


async def one_held_two_waiting() -> tuple[Slots, asyncio.Future, asyncio.Future]:
    """One slot, held, and two waiters for it (in that order)."""
    slots = Slots(1)
    await slots.acquire()
    first, second = (asyncio.ensure_future(slots.acquire()) for _ in range(2))
    await asyncio.sleep(0)
    return slots, first, second


async def test_a_waiter_cancelled_while_waiting_leaves_its_place():
    slots, first, second = await one_held_two_waiting()
    assert slots.waiting == 2
    first.cancel()
    await asyncio.sleep(0)
    assert slots.waiting == 1
    slots.release()
    await asyncio.wait_for(second, 1)  # the slot skipped the cancelled waiter
    slots.release()
    assert slots.free == 1


async def test_a_waiter_cancelled_just_after_it_was_served_passes_the_slot_on():
    slots, served, after = await one_held_two_waiting()
    slots.release()  # hands the slot to `served`, which has not run yet
    served.cancel()
    with pytest.raises(asyncio.CancelledError):
        await served
    await asyncio.wait_for(after, 1)
    slots.release()
    assert slots.free == 1 and slots.waiting == 0


def test_a_pool_needs_at_least_one_slot():
    with pytest.raises(ValueError, match="at least 1"):
        Slots(0)
