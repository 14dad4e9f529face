"""A burst far larger than a gateway's Redis connection pool, with Redis healthy: no 5xx, nothing lost.

The e2e deployment caps each gateway at 8 Redis connections (``queue.redis_max_connections``), so 1,000
requests at once make every gateway wait for connections (redis-py's default pool raises at its cap:
that was 61% 503s); the queue holds the backlog for the fleet's 8 slots. On 2 cores the whole path serves
only tens of such requests a second, so the tail of the burst outlives ``queue.max_wait_s`` (60 s): those
get 429 ``queue_timeout`` with Retry-After, the honest answer, and nothing else may fail. The leases of
the waiting tickets must hold meanwhile (the lease keeper has its own connection).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from tests.conftest import TINY_MODEL_NAME
from tests.e2e.conftest import REPLICAS, auth
from tests.ledger import assert_ledger_balanced, served_by_tenant, snapshot

pytestmark = pytest.mark.e2e

BURST = 1000


async def test_a_1000_request_burst_gets_no_5xx(base_url: str, redis_url: str, api_keys: dict[str, str]) -> None:
    before = served_by_tenant(redis_url)
    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=BURST)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:
        async def one(index: int) -> httpx.Response:
            body = {"model": TINY_MODEL_NAME, "prompt": f"burst {index}", "max_tokens": 1}
            return await client.post("/v1/completions", json=body, headers=auth(api_keys["calm"]))

        replies = await asyncio.gather(*(one(i) for i in range(BURST)))
    statuses = Counter(reply.status_code for reply in replies)
    errors = Counter(f'{reply.json()["error"]["code"]}: {reply.json()["error"]["message"]}'
                     for reply in replies if reply.status_code != 200)
    assert set(statuses) <= {200, 429} and all(e.startswith("queue_timeout") for e in errors), (statuses, errors, snapshot(redis_url).stats)
    print("burst:", dict(statuses), dict(errors))
    assert statuses[200] >= BURST // 4, statuses
    assert all(reply.headers.get("retry-after") for reply in replies if reply.status_code == 429)
    served = sum(reply.json()["usage"]["total_tokens"] for reply in replies if reply.status_code == 200)
    assert_ledger_balanced(redis_url, REPLICAS, served_before=before, client_served={"calm": served})
