"""One tenant floods the gateways past their crowded mark: the flood's requests over it get 429
``too_many_open_requests`` with Retry-After, another tenant's request is still admitted (the slots above the
mark are kept for a newcomer), and once the flood is cancelled every request's count is closed and the
ledger balances. Without the bound the flood would fill each gateway replica and Ray Serve would queue every
later request behind it, first come first served, before any tenant is known (policies/open_share.py).

Gateways of 200 slots (the mark at 180, as the shipped 0.9 of 2,000 is at 1,800), so that the flood is a
few hundred requests; it waits in the global queue behind the fleet's 8 engine slots, holding its slots."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import GatewayDeploymentConfig
from policies.open_share import crowded_at
from tests.conftest import TINY_MODEL_NAME
from tests.faults.conftest import GATEWAYS, REPLICAS, Fleet, gateways_publishing
from tests.ledger import assert_ledger_balanced, served_by_tenant

pytestmark = pytest.mark.faults

GATEWAY_MAX_ONGOING_REQUESTS = 200  # read by the fleet fixture
CROWDED = crowded_at(GATEWAY_MAX_ONGOING_REQUESTS, GatewayDeploymentConfig().crowded_share)
FLOOD = GATEWAYS * GATEWAY_MAX_ONGOING_REQUESTS  # fills both replicas' slots: Serve queues none of it


def _code(reply: httpx.Response) -> str:
    return "" if reply.status_code == 200 else reply.json()["error"]["code"]


def test_a_flood_stops_at_the_crowded_mark_and_another_tenant_gets_in(fleet: Fleet) -> None:
    before = served_by_tenant(fleet.redis_url)
    first_refusal_s, calm, events, flood_open, replies = asyncio.run(_flood_then_calm(fleet.url))
    assert calm.status_code == 200  # admitted past the mark: the slots above it were kept for a newcomer
    codes = Counter(_code(reply) for reply in replies)
    assert codes["too_many_open_requests"] >= 1, codes
    assert set(codes) <= {"", "too_many_open_requests", "queue_timeout"}, codes
    assert all(reply.headers.get("retry-after") for reply in replies if reply.status_code == 429)
    print(f"first refusal after {first_refusal_s:.1f} s; calm ({calm.headers['server-timing']}) served with "
          f"{flood_open} of the flood open; its replies before it was cancelled: {dict(codes)}")
    assert_ledger_balanced(fleet.redis_url, REPLICAS, served_before=before, timeout_s=60,
                           client_served={"calm": json.loads(events[-1][6:])["usage"]["total_tokens"]})
    deadline = time.monotonic() + 30
    while (still := _open_requests(fleet.url)) != 0:  # every way a request ended closed its count
        assert time.monotonic() < deadline, f"{still} requests still counted open"
        time.sleep(0.2)
    assert len(gateways_publishing(fleet.redis_url)) == GATEWAYS


async def _flood_then_calm(url: str) -> tuple[float, httpx.Response, list[str], int, list[httpx.Response]]:
    refused = asyncio.Event()
    replies: list[httpx.Response] = []
    limits = httpx.Limits(max_connections=FLOOD + 10, max_keepalive_connections=FLOOD + 10)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def flood_one(index: int) -> None:
            body = {"model": TINY_MODEL_NAME, "prompt": f"flood {index}", "max_tokens": 1}
            reply = await client.post("/v1/completions", json=body, headers={"x-tenant-id": "flood"})
            replies.append(reply)
            if _code(reply) == "too_many_open_requests":
                refused.set()

        started = time.monotonic()
        flood = [asyncio.create_task(flood_one(i)) for i in range(FLOOD)]
        await asyncio.wait_for(refused.wait(), timeout=120)
        first_refusal_s = time.monotonic() - started
        body = {"model": TINY_MODEL_NAME, "prompt": "calm", "max_tokens": 4, "stream": True,
                "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/completions", json=body, headers={"x-tenant-id": "calm"}) as calm:
            events = [line async for line in calm.aiter_lines() if line.startswith("data: {")]
        flood_open = sum(1 for task in flood if not task.done())
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
    return first_refusal_s, calm, events, flood_open, replies


def _open_requests(url: str) -> float:
    """Every gateway's open requests, as the fleet's /metrics shows them."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    family = {f.name: f for f in text_string_to_metric_families(text)}["fleetgate_gateway_open_requests"]
    return sum(s.value for s in family.samples)
