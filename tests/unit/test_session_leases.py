"""A gateway's queue session never keeps a ticket alive that no request waits for: a withdrawal that Redis
fails, and a ticket the queue lost, both leave the set of tickets it renews."""

from __future__ import annotations

import asyncio

import pytest
import redis

from fleet.session import QueueSession
from policies.types import Grant, TicketSpec


class FakeQueue:
    def __init__(self) -> None:
        self.renewed: list[list[str]] = []
        self.missing: list[str] = []
        self.settings = type("Settings", (), {"lease_ms": 300})()

    def on_client(self, client: object) -> FakeQueue:
        return self

    async def cancel(self, ticket_id: str) -> None:
        raise redis.ConnectionError("Redis went away")

    async def renew(self, ticket_ids: list[str]) -> list[str]:
        self.renewed.append(list(ticket_ids))
        return [t for t in ticket_ids if t in self.missing]

    async def expire(self) -> list[Grant]:
        return []


async def test_a_deadline_withdrawal_that_redis_fails_stops_renewing_the_ticket() -> None:
    session = QueueSession(FakeQueue(), side_client=object(), owner="gw")
    spec = TicketSpec("t1", "acme", "standard", 10)

    async def submit() -> list[Grant]:
        session._owned.add(spec.ticket_id)
        return []

    with pytest.raises(redis.ConnectionError):
        await session._wait_for_grant(spec, 0.01, submit)
    assert spec.ticket_id not in session.owned  # its lease lapses; the queue reaps it and what it holds


async def test_a_ticket_the_queue_lost_is_renewed_no_more() -> None:
    queue = FakeQueue()
    slept = asyncio.Event()
    rounds = []

    async def sleep(_: float) -> None:
        rounds.append(1)
        if len(rounds) > 2:
            slept.set()
            await asyncio.Event().wait()  # stop after two rounds

    session = QueueSession(queue, side_client=object(), owner="gw", sleep=sleep)
    session._owned.update({"kept", "lost"})
    queue.missing = ["lost"]
    task = asyncio.create_task(session._keep_leases())
    await asyncio.wait_for(slept.wait(), 2)
    task.cancel()
    assert queue.renewed == [["kept", "lost"], ["kept"]]
