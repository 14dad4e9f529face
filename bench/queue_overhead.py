"""What the global queue costs per request, on one real Redis: round trips, added latency, grants/s.

    python -m bench.queue_overhead [--seconds 10] [--json out.json]

The queue path of one request is admit (enqueue + dispatch in one Lua step, grant delivered through the
gateway's inbox) and finish (release + charge + dispatch in one Lua step). Forwarding without the queue
does neither, so the time of that path is the latency the queue adds in front of a replica that has room.
Capacity is ample here (no waiting): this isolates the mechanism's own cost from queueing delay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import redis
import redis.asyncio as aioredis

from fleet.keys import QueueKeys
from tests.support.local_redis import running_redis
from fleet.queue import GlobalQueue, QueueSettings
from fleet.session import QueueSession
from policies.types import BandPolicy, ReplicaCapacity, TicketSpec

BANDS = (BandPolicy("interactive"), BandPolicy("standard", aging_ms=30_000), BandPolicy("batch", aging_ms=60_000))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _setup(url: str, namespace: str, replicas: int = 16) -> None:
    queue = GlobalQueue(aioredis.Redis.from_url(url), QueueKeys(namespace=namespace), QueueSettings(BANDS))
    for index in range(replicas):
        await queue.register_replica(ReplicaCapacity(f"r{index:02d}", 4096, 10**9), lease_ms=3_600_000)


def _session(url: str, namespace: str) -> QueueSession:
    queue = GlobalQueue(aioredis.Redis.from_url(url), QueueKeys(namespace=namespace), QueueSettings(BANDS))
    return QueueSession(queue, aioredis.Redis.from_url(url))


async def _one(session: QueueSession, tenant: str) -> float:
    spec = TicketSpec(session.new_ticket_id(), tenant, "standard", 300, owner=session.owner)
    started = time.perf_counter()
    await session.admit(spec, timeout_s=30)
    await session.finish(spec.ticket_id, 280)
    return (time.perf_counter() - started) * 1000


async def latency(url: str, concurrency: int, requests: int) -> dict[str, float]:
    """Added latency (ms) of the queue path at a given concurrency, one gateway."""
    namespace = f"lat{concurrency}"
    await _setup(url, namespace)
    session = _session(url, namespace)
    await session.start()
    samples: list[float] = []

    async def worker(index: int) -> None:
        for _ in range(requests // concurrency):
            samples.append(await _one(session, f"tenant-{index % 8}"))

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    await session.close()
    return {"p50_ms": statistics.median(samples), "p99_ms": _percentile(samples, 0.99), "n": len(samples)}


async def throughput(url: str, gateways: int, tasks: int, seconds: float) -> dict[str, float]:
    """Grants per second on one Redis, several gateway sessions with many tasks each."""
    namespace = "tput"
    await _setup(url, namespace)
    sessions = [_session(url, namespace) for _ in range(gateways)]
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(session: QueueSession, index: int) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await _one(session, f"tenant-{index % 32}")
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(s, i) for s in sessions for i in range(tasks)))
    elapsed = time.perf_counter() - started
    for session in sessions:
        await session.close()
    return {"grants_per_s": done / elapsed, "gateways": gateways, "tasks_per_gateway": tasks}


def round_trips(url: str, requests: int) -> dict[str, float]:
    """Redis commands per request (from INFO commandstats) on the sequential path."""
    client = redis.Redis.from_url(url)
    client.config_resetstat()
    asyncio.run(latency(url, 1, requests))
    stats = client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): value["calls"] for name, value in stats.items()}
    hot = {name: calls.get(name, 0) for name in ("evalsha", "eval", "blpop")}
    return {
        "scripts_per_request": (hot["evalsha"] + hot["eval"]) / requests,
        "blpop_per_request": hot["blpop"] / requests,
        "all_commands_per_request": sum(calls.values()) / requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput run length")
    parser.add_argument("--requests", type=int, default=2000, help="requests per latency run")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, running_redis(Path(work)) as url:
        results = {
            "round_trips": round_trips(url, 500),
            "latency_c1": asyncio.run(latency(url, 1, args.requests)),
            "latency_c16": asyncio.run(latency(url, 16, args.requests)),
            "throughput": asyncio.run(throughput(url, gateways=4, tasks=32, seconds=args.seconds)),
        }
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
