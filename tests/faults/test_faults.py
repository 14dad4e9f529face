"""Faults with load running: a vLLM replica killed mid-stream, Redis restarted, a gateway replica killed.

In each, every request ends with a result or a clear error (no hang), and afterwards the ledger balances:
no ticket left, every replica's capacity back, every grant ended once (tests/ledger.py).
Slow (each kills real processes and waits for Ray Serve to bring them back): `-m faults`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest

from tests.conftest import TINY_MODEL_NAME
from tests.faults.conftest import (
    GATEWAYS, REPLICAS, SLOTS, Fleet, gateways_publishing, kill, replica_pids, wait_for,
)
from tests.ledger import assert_ledger_balanced, snapshot

pytestmark = pytest.mark.faults

STREAM = {"model": TINY_MODEL_NAME, "prompt": "keep going", "max_tokens": 3000, "ignore_eos": True, "stream": True}


def _short(fleet: Fleet, timeout_s: float = 120, **headers: str) -> httpx.Response:
    body = {"model": TINY_MODEL_NAME, "prompt": "short one", "max_tokens": 4, "ignore_eos": True}
    return httpx.post(f"{fleet.url}/v1/completions", json=body, headers=headers, timeout=timeout_s)


def _replica_ids(fleet: Fleet, pool: str) -> set[str]:
    return {r.replica_id for r in snapshot(fleet.redis_url).replicas if r.pool == pool}


def test_vllm_replica_killed_mid_stream(fleet: Fleet) -> None:
    (dead_id,) = _replica_ids(fleet, "latency")

    async def streams_through_the_kill() -> list[list[str]]:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=120) as client, \
                contextlib.AsyncExitStack() as stack:
            streams = [await stack.enter_async_context(client.stream("POST", "/v1/completions", json=STREAM))
                       for _ in range(2)]
            assert [s.headers["x-fleetgate-pool"] for s in streams] == ["latency", "latency"]
            lines = [s.aiter_lines() for s in streams]
            for it in lines:  # both are generating
                while not (await it.__anext__()).startswith("data: {"):
                    pass
            (pid,) = replica_pids("vllm-latency")
            kill(pid)
            return [[line async for line in it if line] for it in lines]

    for tail in asyncio.run(streams_through_the_kill()):
        assert tail[-1] == "data: [DONE]", tail[-3:]
        assert "error" in json.loads(tail[-2].removeprefix("data: ")), tail[-3:]  # a clear error event
    # its lease lapses; meanwhile and after, short requests run on the surviving (throughput) replica
    wait_for(lambda: dead_id not in _replica_ids(fleet, "latency"), 15, "the dead replica's lease to lapse")
    for _ in range(3):
        response = _short(fleet)
        assert response.status_code == 200, response.text
        assert response.headers["x-fleetgate-pool"] == "throughput"
    # Ray Serve restarts it; it registers anew and takes short prompts again
    wait_for(lambda: _replica_ids(fleet, "latency") - {dead_id}, 240, "the restarted replica to register", 1.0)
    assert _short(fleet).headers["x-fleetgate-pool"] == "latency"
    assert_ledger_balanced(fleet.redis_url, REPLICAS, leases_may_expire=True)


def test_redis_restart(fleet: Fleet) -> None:
    assert _short(fleet).status_code == 200
    fleet.redis.stop()
    try:
        down = _short(fleet, timeout_s=30)  # answered, not hung
        assert down.status_code == 503, down.text
        assert down.json()["error"]["code"] == "queue_unavailable"
        assert down.headers["retry-after"] == "1"
        assert down.headers["x-fleetgate-rejected-reason"] == "queue-unavailable"
    finally:
        fleet.redis.start()  # empty: replicas re-register on their next heartbeat, gateways reconnect
    wait_for(lambda: _short(fleet, timeout_s=30).status_code == 200, 30, "the fleet to recover")
    wait_for(lambda: len(gateways_publishing(fleet.redis_url)) == GATEWAYS, 30, "both gateways to reconnect")

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=120) as client:
            body = {"model": TINY_MODEL_NAME, "prompt": "after", "max_tokens": 8, "ignore_eos": True}
            return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(3 * SLOTS)))

    replies = asyncio.run(burst())
    assert [r.status_code for r in replies] == [200] * 3 * SLOTS, [r.text[:200] for r in replies if r.status_code != 200]
    state = assert_ledger_balanced(fleet.redis_url, REPLICAS)  # nothing double-granted after the restart
    assert state.stats["granted"] == state.stats["completed"]


def test_gateway_replica_killed(fleet: Fleet) -> None:
    before = gateways_publishing(fleet.redis_url)

    async def load_through_the_kill() -> None:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=60) as client:
            async with contextlib.AsyncExitStack() as stack:
                streams = [await stack.enter_async_context(client.stream("POST", "/v1/completions", json=STREAM))
                           for _ in range(2 * SLOTS)]  # every slot held, through both gateways
                assert len({s.headers["x-fleetgate-gateway"] for s in streams}) == GATEWAYS
                kill(replica_pids("gateway")[0])
                await asyncio.sleep(2)
            # leaving the block closes every stream: those through the dead gateway were cut already

    asyncio.run(load_through_the_kill())
    # the dead gateway's tickets expire with their leases; every slot comes back
    assert_ledger_balanced(fleet.redis_url, REPLICAS, leases_may_expire=True, timeout_s=60)
    # Serve restarts the gateway replica: a new one publishes, the dead one's series lapse
    wait_for(lambda: len(gateways_publishing(fleet.redis_url)) == GATEWAYS
             and gateways_publishing(fleet.redis_url) != before, 120, "the restarted gateway", 1.0)
    assert _short(fleet).status_code == 200
