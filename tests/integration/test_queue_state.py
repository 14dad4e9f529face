"""The queue's state in Redis is versioned, and its indexes heal from entries left behind.

* A namespace that holds state written by an older release's scripts (no version mark) is refused with a
  clear error rather than dispatched on with indexes that do not describe it.
* A replica or tenant index entry whose replica or tenant is gone (which no sound sequence of calls
  leaves) is dropped when dispatch meets it, and dispatch goes on.
"""

from __future__ import annotations


import uuid

import pytest
import redis
import redis.asyncio as aioredis

from fleet.keys import QueueKeys
from fleet.queue import GlobalQueue, QueueSettings
from policies.types import BandPolicy, EngineSignals, ReplicaCapacity, TicketSpec

pytestmark = pytest.mark.integration


def _queue(redis_url: str) -> GlobalQueue:
    keys = QueueKeys(namespace=f"s{uuid.uuid4().hex[:10]}")
    return GlobalQueue(aioredis.Redis.from_url(redis_url), keys, QueueSettings((BandPolicy("only"),)))


async def test_state_from_an_older_release_is_refused(redis_url: str) -> None:
    queue = _queue(redis_url)
    await queue.client.zadd(queue.keys.prefix + "replicas", {"old-replica": 10**13})  # an old release's
    with pytest.raises(redis.ResponseError, match="older release"):
        await queue.enqueue(TicketSpec("t1", "acme", "only", 10))


async def test_index_entries_left_behind_are_dropped(redis_url: str) -> None:
    queue = _queue(redis_url)
    await queue.register_replica(ReplicaCapacity("real", 2, 1000, accepts=frozenset({"short"})), lease_ms=60_000)
    prefix = queue.keys.families()
    await queue.client.zadd(prefix["replica_index"] + "short||:only", {"ghost": -10**15})  # ranks first, has no hash
    await queue.client.zadd(prefix["tenant_index"] + "only:short", {"ghost-tenant": -1.0})
    granted = await queue.enqueue(TicketSpec("t1", "acme", "only", 10))
    assert [g.replica_id for g in granted.grants] == ["real"]
    await queue.register_replica(ReplicaCapacity("real", 1, 1000, accepts=frozenset({"short"})), lease_ms=60_000)
    waiting = await queue.enqueue(TicketSpec("t2", "acme", "only", 10))  # the replica is full: t2 waits
    assert waiting.admitted and waiting.grants == []
    assert (await queue.complete("t1", 10)).grants[0].ticket_id == "t2"  # dispatch walks past the ghosts
    assert await queue.client.zscore(prefix["replica_index"] + "short||:only", "ghost") is None
    assert await queue.client.zscore(prefix["tenant_index"] + "only:short", "ghost-tenant") is None


async def test_a_deregistered_replica_gets_no_requeued_ticket(redis_url: str) -> None:
    """A replica that left (graceful stop, or gone as the gateway learned from a misroute) is out of the
    fleet at once: the ticket requeued from it goes to another replica, not back to it."""
    queue = _queue(redis_url)
    for replica in ("leaving", "staying"):
        await queue.register_replica(ReplicaCapacity(replica, 1, 1000), lease_ms=60_000)
    (grant,) = (await queue.enqueue(TicketSpec("t1", "acme", "only", 10))).grants
    other = "staying" if grant.replica_id == "leaving" else "leaving"
    await queue.deregister_replica(grant.replica_id)
    requeued = await queue.requeue("t1")
    assert requeued.moved and [g.replica_id for g in requeued.grants] == [other]
    assert [r.replica_id for r in (await queue.snapshot()).replicas] == [other]
    await queue.deregister_replica(grant.replica_id)  # twice (a graceful stop after a misroute): counted once
    stats = (await queue.snapshot()).stats
    assert stats.get("replicas_deregistered") == 1 and "replicas_lapsed" not in stats
    now_ms = (await queue.snapshot()).now_ms
    await queue.register_replica(ReplicaCapacity("brief", 1, 1000), lease_ms=1_000, now_ms=now_ms)
    await queue.deregister_replica("nobody", now_ms=now_ms + 2_000)  # its lease lapsed: reaped, not deregistered
    stats = (await queue.snapshot()).stats
    assert stats["replicas_lapsed"] == 1 and stats["replicas_deregistered"] == 1


async def test_a_replica_held_out_as_unreachable_stays_out_until_its_hold_ends(redis_url: str) -> None:
    """A gateway whose router cannot reach the granted replica (Serve is draining it) takes it out with a hold:
    the replica's own heartbeat, which goes on while it drains, does not bring it back (else it draws grants
    again, and a request that runs out of requeues gets a 503). A graceful stop holds nothing: the same
    replica id may register again at once."""
    queue = _queue(redis_url)
    now_ms = (await queue.snapshot()).now_ms
    for replica in ("draining", "staying"):
        await queue.register_replica(ReplicaCapacity(replica, 4, 1000), lease_ms=60_000, now_ms=now_ms)
    await queue.deregister_replica("draining", now_ms=now_ms, hold_ms=5_000)
    await queue.register_replica(ReplicaCapacity("draining", 4, 1000), lease_ms=60_000, now_ms=now_ms + 4_999)
    grants = [g for t in ("t1", "t2") for g in (await queue.enqueue(TicketSpec(t, "acme", "only", 10),
                                                                   now_ms=now_ms + 4_999)).grants]
    assert {g.replica_id for g in grants} == {"staying"}
    assert [r.replica_id for r in (await queue.snapshot()).replicas] == ["staying"]
    await queue.register_replica(ReplicaCapacity("draining", 4, 1000), lease_ms=60_000, now_ms=now_ms + 5_000)
    assert {r.replica_id for r in (await queue.snapshot()).replicas} == {"draining", "staying"}
    await queue.deregister_replica("staying", now_ms=now_ms + 5_000)  # a graceful stop: no hold
    await queue.register_replica(ReplicaCapacity("staying", 4, 1000), lease_ms=60_000, now_ms=now_ms + 5_000)
    stats = (await queue.snapshot()).stats
    assert len((await queue.snapshot()).replicas) == 2 and stats["replicas_held_out"] == 1


async def test_grants_to_a_replica_that_left_and_came_back_return_nothing_to_it(redis_url: str) -> None:
    """A replica whose lease lapsed (a late heartbeat) or that was deregistered registers again with all its
    capacity free and nothing in flight. Grants made to its earlier registration must not be returned to the
    new one: found by the soak, where in-flight credit went negative, so the gate over-granted and the
    replica never looked idle again."""
    queue = _queue(redis_url)
    await queue.register_replica(ReplicaCapacity("r", 2, 1000), lease_ms=60_000)
    (grant,) = (await queue.enqueue(TicketSpec("t1", "acme", "only", 10, prompt_tokens=8))).grants
    await queue.deregister_replica("r")
    await queue.register_replica(ReplicaCapacity("r", 2, 1000), lease_ms=60_000)
    await queue.report_signals("r", EngineSignals(), received=["t1"])  # the old grant arrives late
    await queue.complete("t1", 10)
    (replica,) = (await queue.snapshot()).replicas
    assert (replica.slots_free, replica.tokens_free, replica.in_flight, replica.in_flight_tokens) == (2, 1000, 0, 0)
    assert grant.replica_id == "r"


async def test_ten_thousand_fairness_ids_keep_redis_bounded(redis_url: str) -> None:
    """One tenant sends 10,000 requests, each with a fresh fairness id, while it stays backlogged: at most
    max_flows of them wait as flows of their own (the rest share the overflow flow), and an idle flow keeps
    no counter, so its state stays that size however many ids go by."""
    keys = QueueKeys(namespace=f"s{uuid.uuid4().hex[:10]}")
    queue = GlobalQueue(aioredis.Redis.from_url(redis_url), keys, QueueSettings((BandPolicy("only"),), max_flows=64))
    await queue.register_replica(ReplicaCapacity("r", 1, 10**9), lease_ms=600_000)
    granted = None
    for index in range(10_000):
        result = await queue.enqueue(TicketSpec(f"t{index}", "spray", "only", 10, flow=f"id-{index}"))
        granted = granted or result.grants[0].ticket_id
    families = keys.families()
    flows, counters = families["flows"] + "only:spray", families["flow_vtc"] + "only:spray"

    async def sizes() -> tuple[int, int, int]:
        lines = [key async for key in queue.client.scan_iter(match=families["queue"] + "only:spray|*", count=1000)]
        return await queue.client.zcard(flows), await queue.client.hlen(counters), len(lines)

    assert await sizes() == (65, 65, 65)  # 64 flows of their own and the overflow flow, one line each
    for index in range(300):  # grants come and go, fresh ids keep arriving, the tenant stays backlogged
        (grant,) = (await queue.complete(granted, 10)).grants
        granted = grant.ticket_id
        await queue.enqueue(TicketSpec(f"more{index}", "spray", "only", 10, flow=f"more-{index}"))
    flows_now, counters_now, lines_now = await sizes()
    assert flows_now <= 65 and counters_now <= 65 and lines_now <= 65


async def test_a_renewed_hold_extends_it_and_is_counted_once(redis_url: str) -> None:
    """A gateway renews the hold on a replica that drains longer than one hold (gateway/leaving_replicas.py):
    the renewal moves the hold's end, and the fleet's count of replicas held out counts the hold once."""
    queue = _queue(redis_url)
    now_ms = (await queue.snapshot()).now_ms
    await queue.register_replica(ReplicaCapacity("draining", 4, 1000), lease_ms=60_000, now_ms=now_ms)
    await queue.deregister_replica("draining", now_ms=now_ms, hold_ms=5_000)
    await queue.deregister_replica("draining", now_ms=now_ms + 2_500, hold_ms=5_000)  # renewed half way
    await queue.register_replica(ReplicaCapacity("draining", 4, 1000), lease_ms=60_000, now_ms=now_ms + 7_499)
    assert (await queue.snapshot()).replicas == []
    assert (await queue.snapshot()).stats["replicas_held_out"] == 1
    await queue.register_replica(ReplicaCapacity("draining", 4, 1000), lease_ms=60_000, now_ms=now_ms + 7_500)
    assert [r.replica_id for r in (await queue.snapshot()).replicas] == ["draining"]
    await queue.deregister_replica("draining", now_ms=now_ms + 8_000, hold_ms=5_000)  # a new hold: counted
    assert (await queue.snapshot()).stats["replicas_held_out"] == 2
