"""A burst far larger than a gateway's Redis connection pool, with Redis healthy: no 5xx, nothing lost.

The e2e deployment caps each gateway at 8 Redis connections (``queue.redis_max_connections``), so 1,000
requests at once make every gateway wait for connections (redis-py's default pool raises at its cap:
that was 61% 503s); the queue holds the backlog for the fleet's 8 slots.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from tests.conftest import TINY_MODEL_NAME
from tests.e2e.conftest import REPLICAS, auth
from tests.ledger import assert_ledger_balanced, served_by_tenant

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
    assert statuses == {200: BURST}, statuses
    served = sum(reply.json()["usage"]["total_tokens"] for reply in replies)
    assert_ledger_balanced(redis_url, REPLICAS, served_before=before, client_served={"calm": served})
