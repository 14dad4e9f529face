"""Rate limits and the metrics board on a real redis-server.

* Two gateways (own connections) hammering one tenant's buckets admit exactly what the limits allow,
  no more: the check is one atomic step in Redis, so it holds across gateway replicas.
* The token bucket refills at its rate, settles to what was served, and says how long to wait.
* Published metrics are read back by any gateway, and a source that stops publishing disappears.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from fleet.metrics_board import MetricsBoard
from fleet.keys import QueueKeys
from fleet.rate_limits import RateLimiter
from gateway.tenants import RateLimits

pytestmark = pytest.mark.integration

NOW = 5_000_000


def _keys() -> QueueKeys:
    return QueueKeys(namespace=f"rl{uuid.uuid4().hex[:10]}")


async def test_request_limit_holds_across_two_gateways(redis_url: str) -> None:
    keys = _keys()
    gateways = [RateLimiter(aioredis.Redis.from_url(redis_url), keys) for _ in range(2)]
    limits = RateLimits(requests_per_minute=30)
    # 2 gateways x 40 concurrent requests at one instant: exactly the bucket's 30 pass
    decisions = await asyncio.gather(*(gateways[i % 2].take("acme", limits, 10, NOW) for i in range(80)))
    assert sum(d.admitted for d in decisions) == 30
    refused = [d for d in decisions if not d.admitted]
    assert all(d.retry_after_s == pytest.approx(2.0) for d in refused)  # one request refills in 60/30 s
    assert (await gateways[0].take("acme", limits, 10, NOW + 2_000)).admitted
    assert not (await gateways[1].take("acme", limits, 10, NOW + 2_000)).admitted
    assert (await gateways[1].take("other", limits, 10, NOW)).admitted  # buckets are per tenant


async def test_token_limit_takes_estimates_and_settles_to_what_was_served(redis_url: str) -> None:
    limiter = RateLimiter(aioredis.Redis.from_url(redis_url), _keys())
    limits = RateLimits(tokens_per_minute=6000)
    assert (await limiter.take("acme", limits, 5000, NOW)).admitted
    refused = await limiter.take("acme", limits, 2000, NOW)
    assert not refused.admitted and refused.retry_after_s == pytest.approx(10.0)  # 1000 tokens at 100/s
    await limiter.settle("acme", limits, -4000, NOW)  # it served 1000 of its 5000 estimate
    assert (await limiter.take("acme", limits, 2000, NOW)).admitted
    # larger than the whole bucket: passes when the bucket is full, so no request is impossible
    assert (await limiter.take("big", limits, 9000, NOW)).admitted
    assert not (await limiter.take("big", limits, 1, NOW + 1000)).admitted


async def test_unlimited_tenants_never_touch_redis(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    keys = _keys()
    assert (await RateLimiter(client, keys).take("free", RateLimits(), 10**9)).admitted
    assert not await client.exists(keys.rate_bucket("free"))


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
