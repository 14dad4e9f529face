"""The queue's clock against a real Redis: a jump of the server's wall clock (a paused or migrated VM, an NTP
step) drops no live lease, while a holder that stops renewing still loses its leases a lease later.

The scripts read the server's wall clock; here a stand-in reading is passed in its place (``wall_clock``),
so the jumps are exact and the test waits for nothing.
"""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from fleet.keys import QueueKeys
from fleet.queue import GlobalQueue, QueueSettings
from policies.types import BandPolicy, ReplicaCapacity, TicketSpec

pytestmark = pytest.mark.integration

LEASE_MS = 10_000
RENEW_EVERY_MS = LEASE_MS // 3  # what gateways and replicas do
T0 = 1_700_000_000_000


class WallClock:
    """The server's wall clock, as the test moves it."""

    def __init__(self) -> None:
        self.ms = T0

    def __call__(self) -> int:
        return self.ms


async def _fleet(redis_url: str) -> tuple[GlobalQueue, WallClock, list[str]]:
    wall = WallClock()
    queue = GlobalQueue(aioredis.Redis.from_url(redis_url), QueueKeys(namespace=f"c{uuid.uuid4().hex[:10]}"),
                        QueueSettings((BandPolicy("standard"),), lease_ms=LEASE_MS), wall_clock=wall)
    await queue.register_replica(ReplicaCapacity("replica-a", 1, 4096), lease_ms=LEASE_MS)
    ids = [f"ticket-{i}" for i in range(2)]
    for ticket_id in ids:  # one slot: the first is granted, the second waits
        await queue.enqueue(TicketSpec(ticket_id, "tenant-a", "standard", 100, owner="gateway-a"))
    return queue, wall, ids


async def _renew_all(queue: GlobalQueue, ids: list[str]) -> None:
    assert await queue.renew(ids) == []
    await queue.register_replica(ReplicaCapacity("replica-a", 1, 4096), lease_ms=LEASE_MS)


async def test_a_forward_jump_of_the_wall_clock_drops_no_live_lease(redis_url: str) -> None:
    queue, wall, ids = await _fleet(redis_url)
    wall.ms += RENEW_EVERY_MS - 1  # a renewal is nearly due: the leases have two thirds left
    before = await queue.snapshot()
    wall.ms += 600_000  # the VM was paused for ten minutes
    await queue.expire()
    after = await queue.snapshot()
    assert after.wall_ms == wall.ms
    assert after.now_ms - before.now_ms == LEASE_MS // 2  # the step counts half a lease, not ten minutes
    assert after.tickets == 2 and after.stats.get("expired", 0) == 0
    assert [replica.replica_id for replica in after.replicas] == ["replica-a"]
    await _renew_all(queue, ids)  # the holders wake and renew: everything goes on
    wall.ms += 600_000
    await queue.expire()
    assert (await queue.snapshot()).stats.get("expired", 0) == 0


async def test_a_holder_that_stops_renewing_still_loses_its_leases(redis_url: str) -> None:
    queue, wall, ids = await _fleet(redis_url)
    # the gateway holding both tickets dies; the replica keeps its heartbeat, and the clock runs normally
    for _ in range(3):
        wall.ms += RENEW_EVERY_MS
        await queue.register_replica(ReplicaCapacity("replica-a", 1, 4096), lease_ms=LEASE_MS)
    assert (await queue.snapshot()).tickets == 2  # 9,999 ms: not yet a lease
    wall.ms += RENEW_EVERY_MS
    await queue.expire()
    snapshot = await queue.snapshot()
    assert snapshot.tickets == 0 and snapshot.stats["expired"] == 2
    assert snapshot.replicas[0].idle


async def test_a_backward_step_neither_rewinds_the_clock_nor_lengthens_leases(redis_url: str) -> None:
    queue, wall, ids = await _fleet(redis_url)
    start = (await queue.snapshot()).now_ms
    wall.ms -= 3_600_000  # NTP stepped the clock back an hour
    assert (await queue.snapshot()).now_ms == start
    for _ in range(4):  # nobody renews; the wall clock runs on from its new reading
        wall.ms += RENEW_EVERY_MS
        await queue.expire()
    assert (await queue.snapshot()).stats["expired"] == 2  # a lease after they were last renewed
