"""Rate limits and the metrics board on a real redis-server.

* Two gateways (own connections) hammering one tenant's buckets admit exactly what the limits allow,
  no more: the check is part of the enqueue's atomic step in Redis, so it holds across gateway replicas.
* The token bucket refills at its rate, settles at completion to what was served, takes what a running
  request serves past its estimate as its replica reports it, is refunded when a waiting ticket is
  withdrawn, and says how long to wait.
* Published metrics are read back by any gateway, and a source that stops publishing disappears.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from fleet.keys import QueueKeys
from fleet.metrics_board import MetricsBoard
from fleet.queue import GlobalQueue, QueueSettings
from gateway.tenants import RateLimits
from policies.types import BandPolicy, EngineSignals, ReplicaCapacity, TicketSpec

pytestmark = pytest.mark.integration

NOW = 5_000_000


def _keys() -> QueueKeys:
    return QueueKeys(namespace=f"rl{uuid.uuid4().hex[:10]}")


def _queue(redis_url: str, keys: QueueKeys) -> GlobalQueue:
    return GlobalQueue(aioredis.Redis.from_url(redis_url), keys, QueueSettings((BandPolicy("only"),)))


def _ticket(tenant: str, cost: int) -> TicketSpec:
    return TicketSpec(uuid.uuid4().hex, tenant, "only", cost)


async def test_request_limit_holds_across_two_gateways(redis_url: str) -> None:
    keys = _keys()
    gateways = [_queue(redis_url, keys) for _ in range(2)]
    limits = RateLimits(requests_per_minute=30)
    # 2 gateways x 40 concurrent enqueues at one instant: exactly the bucket's 30 pass
    results = await asyncio.gather(*(gateways[i % 2].enqueue(_ticket("acme", 10), NOW, limits) for i in range(80)))
    assert sum(r.admitted for r in results) == 30
    refused = [r for r in results if not r.admitted]
    assert {r.status for r in refused} == {"rate_limited"}
    assert all(r.retry_after_ms == 2000 for r in refused)  # one request refills in 60/30 s
    assert all(r.held_ms == 2000 for r in refused)  # and no request of any size passes before then
    assert (await gateways[0].enqueue(_ticket("acme", 10), NOW + 2_000, limits)).admitted
    assert not (await gateways[1].enqueue(_ticket("acme", 10), NOW + 2_000, limits)).admitted
    assert (await gateways[1].enqueue(_ticket("other", 10), NOW, limits)).admitted  # buckets are per tenant


async def test_token_limit_takes_estimates_settles_on_completion_and_refunds_on_cancel(redis_url: str) -> None:
    queue = _queue(redis_url, _keys())
    await queue.register_replica(ReplicaCapacity("r", 10, 10**6), lease_ms=10**9, now_ms=NOW)
    limits = RateLimits(tokens_per_minute=6000)
    first = _ticket("acme", 5000)
    assert (await queue.enqueue(first, NOW, limits)).admitted
    refused = await queue.enqueue(_ticket("acme", 2000), NOW, limits)
    assert refused.status == "rate_limited" and refused.retry_after_ms == 10_000  # 1000 tokens at 100/s
    assert refused.held_ms == 0  # 1000 tokens are left: a smaller request could pass now
    assert (await queue.complete(first.ticket_id, 1000, NOW)).done  # it served 1000 of its 5000 estimate
    assert (await queue.enqueue(_ticket("acme", 2000), NOW, limits)).admitted
    # larger than the whole bucket: passes when the bucket is full, so no request is impossible
    assert (await queue.enqueue(_ticket("big", 9000), NOW, limits)).admitted
    after_big = await queue.enqueue(_ticket("big", 1), NOW + 1000, limits)
    assert not after_big.admitted
    assert after_big.held_ms == after_big.retry_after_ms == 29_010  # at -2,900 tokens, 2,901 to one, at 100/s
    # a waiting ticket withdrawn gives its estimate back: fill the replica, queue one, cancel it
    await queue.register_replica(ReplicaCapacity("r", 2, 10**6), lease_ms=10**9, now_ms=NOW)  # both held
    waiting = _ticket("calm", 6000)
    assert (await queue.enqueue(waiting, NOW, limits)).grants == []
    assert (await queue.enqueue(_ticket("calm", 1), NOW, limits)).status == "rate_limited"
    assert (await queue.cancel(waiting.ticket_id, NOW)).status == "cancelled"
    assert (await queue.enqueue(_ticket("calm", 6000), NOW, limits)).admitted


async def test_a_request_running_past_its_estimate_takes_its_tokens_as_it_runs(redis_url: str) -> None:
    queue = _queue(redis_url, _keys())
    await queue.register_replica(ReplicaCapacity("r", 10, 10**6), lease_ms=10**9, now_ms=NOW)
    limits = RateLimits(tokens_per_minute=6000)
    running = _ticket("acme", 1000)
    assert (await queue.enqueue(running, NOW, limits)).admitted
    assert (await queue.enqueue(_ticket("acme", 4000), NOW, limits)).admitted  # 1,000 tokens left
    await queue.report_signals("r", EngineSignals(), [running.ticket_id], NOW, progress=[(running.ticket_id, 2600)])
    refused = await queue.enqueue(_ticket("acme", 1), NOW, limits)
    assert refused.status == "rate_limited" and refused.held_ms == 6_010  # 1,000 less the 1,600 run past: -600
    assert (await queue.complete(running.ticket_id, 2800, NOW + 1_000)).done  # 200 more than its last report
    refused = await queue.enqueue(_ticket("acme", 1), NOW + 1_000, limits)
    assert refused.held_ms == 7_010  # -600 + 100 refilled - 200: 701 tokens to one, at 100 a second


async def test_unlimited_tenants_never_touch_a_bucket(redis_url: str) -> None:
    keys = _keys()
    queue = _queue(redis_url, keys)
    assert (await queue.enqueue(_ticket("free", 10**6), NOW, RateLimits())).admitted
    assert not await queue.client.exists(keys.rate_bucket("free"))


async def test_metrics_board_shows_live_sources_only(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    keys = _keys()
    board = MetricsBoard(client, keys, ttl_s=1.0)
    await board.publish("gateway:a", {"gateway": "a"}, "x 1\n")
    await MetricsBoard(aioredis.Redis.from_url(redis_url), keys, ttl_s=30).publish("gateway:b", {"gateway": "b"}, "x 2\n")
    assert sorted(labels["gateway"] for labels, _ in await board.read()) == ["a", "b"]
    await client.pexpire(keys.metrics("gateway:a"), 1)  # a stops publishing: its key lapses
    while await client.exists(keys.metrics("gateway:a")):
        await asyncio.sleep(0.01)
    assert [labels["gateway"] for labels, _ in await board.read()] == ["b"]
    assert await client.smembers(keys.metrics_sources()) == {b"gateway:b"}


def test_status_cli_shows_each_replica_and_its_pools_reserve(redis_url: str, tmp_path,
                                                             capsys: pytest.CaptureFixture) -> None:
    from gateway.cli import main as fleetgate
    from tests.conftest import REPO_ROOT
    from tests.support.local_redis import has_functions

    keys = QueueKeys(namespace=f"st{uuid.uuid4().hex[:10]}")
    replica = ReplicaCapacity("lat-1", 4, 10**6, frozenset({"short", "long"}), "latency", frozenset({"short"}),
                              frozenset({"long"}), reserve=1)
    asyncio.run(_queue(redis_url, keys).register_replica(replica, lease_ms=10**9))
    config = REPO_ROOT / "deploy" / "local.yaml"
    local = config.read_text().replace("namespace: local", f"namespace: {keys.namespace}")
    assert local != config.read_text()
    (tmp_path / "local.yaml").write_text(local)
    assert fleetgate(["status", "--config", str(tmp_path / "local.yaml"), "--redis-url", redis_url]) == 0
    out = capsys.readouterr().out
    assert "lat-1" in out and "short (reserve 1)" in out, out
    assert f"lua={'functions' if has_functions(redis_url) else 'scripts'}" in out.splitlines()[0]
