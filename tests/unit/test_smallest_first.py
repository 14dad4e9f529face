"""The body parser's lock (gateway/smallest_first.py): the smallest waiting job goes next, first come among
equals, and a waiter cancelled as the lock reaches it passes it on."""

from __future__ import annotations

import asyncio

import pytest

from gateway.smallest_first import SmallestFirstLock

pytestmark = pytest.mark.timeout(20)


def _job(lock: SmallestFirstLock, order: list[str]):
    """A job that records when it holds the lock, and holds it until ``hold`` is set (if given)."""

    async def job(name: str, size: int, hold: asyncio.Event | None = None) -> None:
        async with lock.turn(size):
            order.append(name)
            if hold is not None:
                await hold.wait()

    return job


async def test_the_smallest_waiter_goes_next() -> None:
    lock, order = SmallestFirstLock(), []
    release = asyncio.Event()

    job = _job(lock, order)

    first = asyncio.create_task(job("holder", 9, release))
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(job(name, size)) for name, size in
               (("big", 8_000_000), ("small", 70_000), ("medium", 900_000), ("small again", 70_000))]
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, *waiters)
    assert order == ["holder", "small", "small again", "medium", "big"]


async def test_a_waiter_cancelled_as_its_turn_comes_passes_the_lock_on() -> None:
    lock, order = SmallestFirstLock(), []
    release = asyncio.Event()

    job = _job(lock, order)

    holder = asyncio.create_task(job("holder", 1, release))
    await asyncio.sleep(0)
    doomed, patient = asyncio.create_task(job("doomed", 2)), asyncio.create_task(job("patient", 3))
    await asyncio.sleep(0)
    release.set()
    await asyncio.sleep(0)  # the holder releases: "doomed" is handed the lock...
    doomed.cancel()  # ...and cancelled before it runs
    await asyncio.gather(holder, patient, return_exceptions=False)
    assert doomed.cancelled()
    assert order == ["holder", "patient"]  # without the hand-on, "patient" waits for ever (the timeout fails it)
    async with lock.turn(1):  # and the lock is free again
        pass
