"""The gateway and the global queue under `serve run` in front of simulated replicas (replicas/sim_replica.py):
the fleet-scale benchmark's set-up, on 8 replicas here. Real Ray Serve, real Redis, real gateway; only the
engine is simulated."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from bench.live import _simulated_fleet
from tests.support.serve_launcher import REPO_ROOT, serve_run
from tests.ledger import assert_ledger_balanced, snapshot

pytestmark = pytest.mark.integration
REPLICAS = 8
NAMESPACE = "simfleet"  # the session's Redis may also hold the e2e deployment's queue (namespace "local")


async def _burst(base_url: str, count: int) -> list[tuple[int, int, str]]:
    async def one(i: int) -> tuple[int, int, str]:
        body = {"model": "tiny-llama", "prompt": list(range(10, 10 + (40 if i % 4 else 3000))), "max_tokens": 8,
                "stream": True}
        headers = {"x-tenant-id": f"t{i % 3}", "x-priority": ("interactive", "batch")[i % 2]}
        async with client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
            chunks = [line async for line in response.aiter_lines() if line.startswith("data: {")]
            return response.status_code, len(chunks), response.headers.get("x-fleetgate-pool", "")

    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        return await asyncio.gather(*(one(i) for i in range(count)))


def test_gateway_serves_a_burst_on_a_simulated_fleet(tmp_path: Path, redis_url: str, tiny_model_path: Path) -> None:
    def edit(args: dict) -> None:
        args["access"] = {"allow_anonymous": True, "trust_tenant_header": True}
        args["queue"]["redis_url"] = redis_url
        args["queue"]["namespace"] = NAMESPACE
        _simulated_fleet(args, "gateway", "gpu-h100-llama3-8b", REPLICAS)

    ready = lambda: len(snapshot(redis_url, NAMESPACE).replicas) == REPLICAS  # noqa: E731
    with serve_run(REPO_ROOT / "deploy" / "local.yaml", tmp_path, env={"REDIS_URL": redis_url}, edit=edit,
                   ready=ready) as base_url:
        results = asyncio.run(_burst(base_url, 120))
        assert all(status == 200 for status, _, _ in results), results
        assert all(chunks == 8 for _, chunks, _ in results)  # 8 tokens each, nothing cut
        pools = {pool for *_, pool in results}
        assert pools == {"latency", "throughput"}  # short prompts on one pool, 3000-token ones on the other
        assert_ledger_balanced(redis_url, REPLICAS, namespace=NAMESPACE)
