"""Streams cut by their clients, and what their tenant was charged against what the engines counted.

    python -m bench.cut_storm [--url http://127.0.0.1:8000] [--streams 60] [--concurrency 12] [--seed 1]
                              [--early]

Each stream is a long completion (``ignore_eos``) that its client leaves after 2-40 events; with ``--early``
a third leave before the first token (a 5-60 ms timeout) and a third after it. Needs a deployment that names
the tenant by ``x-tenant-id`` and serves ``/metrics`` without a key (``scripts/serve-local.sh``). Prints the
tokens vLLM's counters grew by (``vllm:prompt_tokens`` + ``vllm:generation_tokens``, once they hold still)
and what the tenant was charged (``fleetgate_served_tokens``). A prompt aborted mid-prefill is charged in
full but missing from vLLM's counters, so ``--early`` may show a charge above them.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid

import httpx
from prometheus_client.parser import text_string_to_metric_families

ENGINE_COUNTERS = {"vllm:prompt_tokens", "vllm:generation_tokens"}


def _totals(url: str, tenant: str) -> tuple[float, float]:
    """(the engines' token counters, the tenant's charge), once both hold still for 3 s and every registered
    replica has published its counters (a replica's first publish carries its warm-up request's tokens)."""
    last, since = None, time.monotonic()
    while True:
        reply = httpx.get(f"{url}/metrics", timeout=30)
        if reply.status_code != 200:  # the deployment is still coming up
            time.sleep(0.5)
            continue
        families = list(text_string_to_metric_families(reply.text))
        replicas = sum(len(f.samples) for f in families if f.name == "fleetgate_replica_slots_in_use")
        published = sum(1 for f in families if f.name == "vllm:prompt_tokens" for s in f.samples
                        if s.name.endswith("_total"))
        if published < max(1, replicas):
            last = None
            time.sleep(0.5)
            continue
        engines = sum(s.value for f in families if f.name in ENGINE_COUNTERS for s in f.samples
                      if s.name.endswith("_total"))
        charged = sum(s.value for f in families if f.name == "fleetgate_served_tokens" for s in f.samples
                      if s.name.endswith("_total") and s.labels.get("tenant") == tenant)
        if (engines, charged) != last:
            last, since = (engines, charged), time.monotonic()
        elif time.monotonic() - since > 3:
            return engines, charged
        time.sleep(0.25)


async def _leave(client: httpx.AsyncClient, model: str, tenant: str, events: int) -> None:
    body = {"model": model, "prompt": "run for a while " * 20, "max_tokens": 2000, "ignore_eos": True,
            "stream": True}
    async with client.stream("POST", "/v1/completions", json=body, headers={"x-tenant-id": tenant}) as reply:
        seen = 0
        async for line in reply.aiter_lines():
            seen += line.startswith("data:")
            if seen >= events:
                return


async def storm(url: str, streams: int, concurrency: int, early: bool, rng: random.Random) -> dict[str, float]:
    """Run the streams; the engines' count and the charge they added."""
    tenant = f"cut-{uuid.uuid4().hex[:8]}"
    engines_before, charged_before = _totals(url, tenant)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]

        async def one(index: int) -> None:
            async with gate:
                kind = index % 3 if early else 2
                if kind == 0:
                    try:
                        await asyncio.wait_for(_leave(client, model, tenant, 10**6), rng.uniform(0.005, 0.06))
                    except TimeoutError:
                        pass
                else:
                    await _leave(client, model, tenant, 1 if kind == 1 else rng.randint(2, 40))

        await asyncio.gather(*(one(index) for index in range(streams)))
    engines, charged = _totals(url, tenant)
    return {"engines": engines - engines_before, "charged": charged - charged_before,
            "ratio": (charged - charged_before) / max(1.0, engines - engines_before)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--streams", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--early", action="store_true", help="also leave before the first token, and at it")
    args = parser.parse_args()
    print(asyncio.run(storm(args.url, args.streams, args.concurrency, args.early, random.Random(args.seed))))


if __name__ == "__main__":
    main()
