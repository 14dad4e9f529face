"""End to end through the global queue: 2 gateway replicas, 2 vLLM replicas of 4 slots each, one Redis.

* a flood from one tenant does not hold another tenant back beyond the fairness bound;
* a high-priority request overtakes queued low-priority work;
* afterwards the ledger balances (tests/ledger.py): every grant ended once, every slot and token back, no
  ticket left, each tenant charged exactly the tokens its clients were served.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import pytest

from tests.conftest import TINY_MODEL_NAME
from tests.e2e.conftest import GATEWAY_REPLICAS, REPLICAS, auth
from tests.ledger import assert_ledger_balanced, served_by_tenant, snapshot

pytestmark = pytest.mark.e2e

FLOOD = 48  # 6x the fleet's 8 slots
OUTPUT_TOKENS = 48


async def _completion(client: httpx.AsyncClient, key: str, band: str, prompt: str) -> httpx.Response:
    body = {"model": TINY_MODEL_NAME, "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True}
    response = await client.post("/v1/completions", json=body, headers={**auth(key), "x-priority": band})
    assert response.status_code == 200, response.text
    return response


def _queue_ms(response: httpx.Response) -> float:
    return float(response.headers["x-fleetgate-queue-ms"])


async def _flood_then(base_url: str, redis_url: str, flood_key: str, flood_band: str, late_key: str, late_band: str):
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        flood = [asyncio.create_task(_completion(client, flood_key, flood_band, f"flood {i} {'x' * (i % 7)}"))
                 for i in range(FLOOD)]
        # send the late requests once half the flood waits in the global queue (observed in Redis)
        await _until_backlog(redis_url, flood, FLOOD // 2)
        late = [await _completion(client, late_key, late_band, f"late {i}") for i in range(3)]
        flood_done = await asyncio.gather(*flood)
    return flood_done, late


async def _until_backlog(redis_url: str, flood: list[asyncio.Task], tickets: int, timeout_s: float = 120) -> None:
    """Wait until ``tickets`` wait in the global queue; fail at once if a flood request failed or all ended."""
    deadline = time.monotonic() + timeout_s
    while sum(band.queued for band in (await asyncio.to_thread(snapshot, redis_url)).bands) < tickets:
        for task in (t for t in flood if t.done()):
            task.result()  # re-raises a flood request's failure (its status and body)
        assert not all(t.done() for t in flood), f"the whole flood was served before {tickets} of it queued"
        assert time.monotonic() < deadline, f"fewer than {tickets} tickets queued after {timeout_s} s"
        await asyncio.sleep(0.05)


def _client_served(tenant_responses: dict[str, list[httpx.Response]]) -> dict[str, int]:
    return {tenant: sum(r.json()["usage"]["total_tokens"] for r in responses)
            for tenant, responses in tenant_responses.items()}


def test_flooding_tenant_does_not_hold_back_another(base_url: str, redis_url: str, api_keys: dict) -> None:
    before = served_by_tenant(redis_url)
    flood, late = asyncio.run(_flood_then(base_url, redis_url, api_keys["flood"], "standard", api_keys["calm"],
                                          "standard"))
    flood_waits = sorted(_queue_ms(r) for r in flood)
    late_waits = [_queue_ms(r) for r in late]
    service_ms = statistics.median(r.elapsed.total_seconds() * 1000 - _queue_ms(r) for r in flood)
    # Fair share: the calm tenant's ticket is lifted to the flood's counter, so it takes the next free slot.
    # Its wait is bounded by about one request's service time (a slot turning over), while the flood's
    # backlog waits for many turnovers.
    assert max(late_waits) < 2 * service_ms + 500, (late_waits, service_ms)
    assert max(late_waits) < flood_waits[-1] / 3, (late_waits, flood_waits[-1])
    assert len({r.headers["x-fleetgate-gateway"] for r in flood}) == GATEWAY_REPLICAS
    assert_ledger_balanced(redis_url, REPLICAS, served_before=before,
                           client_served=_client_served({"flood": flood, "calm": late}))


def test_high_priority_overtakes_queued_low_priority(base_url: str, redis_url: str, api_keys: dict) -> None:
    before = served_by_tenant(redis_url)
    flood, late = asyncio.run(_flood_then(base_url, redis_url, api_keys["flood"], "batch", api_keys["flood"],
                                          "interactive"))
    batch_waits = sorted(_queue_ms(r) for r in flood)
    interactive_waits = [_queue_ms(r) for r in late]
    assert all(r.headers["x-fleetgate-band"] == "interactive" for r in late)
    # same tenant for both, so only the band decides: interactive goes before every queued batch ticket
    assert max(interactive_waits) < batch_waits[len(batch_waits) // 2], (interactive_waits, batch_waits)
    assert_ledger_balanced(redis_url, REPLICAS, served_before=before,
                           client_served=_client_served({"flood": flood + late}))


def test_unknown_priority_is_400(base_url: str, api_keys: dict) -> None:
    response = httpx.post(f"{base_url}/v1/completions", headers={**auth(api_keys["calm"]), "x-priority": "urgent!!"},
                          json={"model": TINY_MODEL_NAME, "prompt": "x", "max_tokens": 2})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_header"


def test_response_carries_classification(base_url: str, api_keys: dict) -> None:
    response = httpx.post(f"{base_url}/v1/completions", headers={**auth(api_keys["calm"]), "x-priority": "interactive"},
                          json={"model": TINY_MODEL_NAME, "prompt": "hello " * 600, "max_tokens": 2}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["x-fleetgate-band"] == "interactive"
    assert response.headers["x-fleetgate-length-class"] == "long"
    assert int(response.headers["x-fleetgate-prompt-tokens"]) == response.json()["usage"]["prompt_tokens"]
