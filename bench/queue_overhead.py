"""What the global queue costs per request, on one real Redis: round trips, Redis CPU, grants/s, tail.

    python -m bench.queue_overhead [--seconds 8] [--processes 2] [--json out.json]

The queue path of one request is admit (enqueue + dispatch in one Lua step; the grant comes back inline
when there is room, else through the gateway's inbox) and finish (release + charge + dispatch in one Lua
step). Forwarding without the queue does neither, so that path is what the queue adds in front of a replica
with room. Measured here:

* round trips per request (INFO commandstats), with and without a rate-limited tenant;
* Redis CPU per request (the scripts' own time from INFO commandstats, and the server's CPU from INFO cpu)
  with R replicas registered (16, 64, 256) and W tenants waiting whose next ticket cannot be placed (0,
  1,000): what dispatch costs as the fleet and the backlog grow; and with R replicas split into a latency
  pool that guards long prompts and a throughput pool (the guarded index kept on every grant and release);
* grants/s from several client processes (so that Redis, not one Python process, is the limit), and the
  admit latency at a paced 2,000 requests/s, with 64 replicas;
* the longest single call (SLOWLOG) in bulk cases: a dead gateway's 5,000 tickets reaped, 5,064 leases
  renewed, a 256-slot replica registering against a backlog.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from fleet.config import QueueConfig
from fleet.connection import redis_client
from fleet.keys import QueueKeys
from fleet.queue import GlobalQueue, QueueSettings
from fleet.session import QueueSession
from gateway.tenants import RateLimits
from policies.types import BandPolicy, ReplicaCapacity, TicketSpec
from tests.support.local_redis import running_redis

BANDS = (BandPolicy("interactive"), BandPolicy("standard", aging_ms=30_000), BandPolicy("batch", aging_ms=60_000))
LIMITED = RateLimits(requests_per_minute=10**9, tokens_per_minute=10**12)  # never reached: the cost alone


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _client(url: str) -> aioredis.Redis:
    return redis_client(QueueConfig(redis_url=url))  # the gateway's own: a bounded pool that waits when busy


SCRIPT_COMMANDS = ("evalsha", "eval", "fcall")  # the queue's Lua runs as a function (FCALL) or a script
FUNCTIONS = {"on": True}  # --scripts: every case through scripts (EVALSHA), as on a Redis without functions


def _queue(url: str, namespace: str, functions: bool | None = None) -> GlobalQueue:
    # leases far longer than a run: nothing expires while the bench measures
    return GlobalQueue(_client(url), QueueKeys(namespace=namespace), QueueSettings(BANDS, lease_ms=3_600_000),
                       use_functions=FUNCTIONS["on"] if functions is None else functions)


def _replica(index: int, slots: int, pooled: bool) -> ReplicaCapacity:
    """A replica for short prompts; ``pooled``: every other one a latency replica that guards long prompts,
    the rest throughput replicas built for them (deploy/gpu.yaml's pools)."""
    if not pooled:
        return ReplicaCapacity(f"r{index:03d}", slots, 10**9, accepts=frozenset({"short"}))
    latency = index % 2 == 0
    return ReplicaCapacity(f"r{index:03d}", slots, 10**9, accepts=frozenset({"short", "long"}),
                           pool="latency" if latency else "throughput",
                           prefers=frozenset({"short" if latency else "long"}),
                           guarded=frozenset({"long"}) if latency else frozenset(), step_tokens=1024)


async def _fleet(url: str, namespace: str, replicas: int, waiting_tenants: int = 0, slots: int = 4096,
                 pooled: bool = False) -> None:
    """``replicas`` replicas for short prompts with room, and ``waiting_tenants`` tenants each waiting with a
    long ticket for the one long-prompt replica, which is full."""
    queue = _queue(url, namespace)
    for index in range(replicas):
        await queue.register_replica(_replica(index, slots, pooled), lease_ms=3_600_000)
    await queue.register_replica(ReplicaCapacity("long", 1, 10**9, accepts=frozenset({"long"})), lease_ms=3_600_000)
    await queue.enqueue(TicketSpec("holder", "holder", "standard", 100, length_class="long"))
    for index in range(waiting_tenants):
        await queue.enqueue(TicketSpec(f"w{index}", f"waiting-{index}", "standard", 100, length_class="long"))
    await queue.client.aclose()


def _commandstats(client: redis.Redis) -> dict[str, dict[str, float]]:
    return {name.removeprefix("cmdstat_"): value for name, value in client.info("commandstats").items()}


def _server_cpu_s(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def _sequential(url: str, namespace: str, requests: int, limits: Any = None,
                      functions: bool | None = None) -> list[float]:
    queue = _queue(url, namespace, functions)
    samples = []
    for index in range(requests):
        spec = TicketSpec(uuid.uuid4().hex, f"tenant-{index % 8}", "standard", 300)
        started = time.perf_counter()
        result = await (queue.enqueue(spec) if limits is None else queue.enqueue(spec, limits=limits))
        assert result.grants and result.grants[0].ticket_id == spec.ticket_id, result
        await queue.complete(spec.ticket_id, 280)
        samples.append((time.perf_counter() - started) * 1000)
    await queue.client.aclose()
    return samples


def redis_cost(url: str, replicas: int, waiting_tenants: int, requests: int,
               pooled: bool = False, functions: bool | None = None) -> dict[str, Any]:
    """Redis time per request (enqueue + complete) with this many replicas and unplaceable waiting tenants
    (``pooled``: half of them latency replicas that keep a guarded index; ``functions`` False: scripts)."""
    functions = FUNCTIONS["on"] if functions is None else functions
    form = "functions" if functions else "scripts"
    namespace = f"cost-{replicas}-{waiting_tenants}{'-pooled' if pooled else ''}-{form}"
    asyncio.run(_fleet(url, namespace, replicas, waiting_tenants, pooled=pooled))
    client = redis.Redis.from_url(url)
    client.config_resetstat()
    cpu_before = _server_cpu_s(client)
    samples = asyncio.run(_sequential(url, namespace, requests, functions=functions))
    cpu = _server_cpu_s(client) - cpu_before
    stats = _commandstats(client)
    script_us = sum(stats.get(name, {}).get("usec", 0) for name in SCRIPT_COMMANDS)
    return {"replicas": replicas, "waiting_tenants": waiting_tenants, "pooled": pooled, "lua": form,
            "requests": requests,
            "script_us_per_request": script_us / requests, "server_cpu_us_per_request": cpu * 1e6 / requests,
            "path_p50_ms": statistics.median(samples), "path_p99_ms": _percentile(samples, 0.99)}


def round_trips(url: str, requests: int) -> dict[str, float]:
    """Redis commands per request on the sequential path through a gateway session (capacity free)."""
    namespace = "trips"
    asyncio.run(_fleet(url, namespace, 16))
    client = redis.Redis.from_url(url)
    result = {}
    for name, limits in (("unlimited", None), ("rate_limited", LIMITED)):
        client.config_resetstat()

        async def run(limits: Any = limits) -> None:
            session = QueueSession(_queue(url, namespace), _client(url))
            for index in range(requests):
                spec = TicketSpec(session.new_ticket_id(), f"tenant-{index % 8}", "standard", 300,
                                  owner=session.owner)
                await session.admit(spec, timeout_s=30, limits=limits)
                await session.finish(spec.ticket_id, 280)
            await session.close()

        asyncio.run(run())
        calls = {name: value["calls"] for name, value in _commandstats(client).items()}
        hot = sum(calls.get(c, 0) for c in (*SCRIPT_COMMANDS, "blpop", "lpop"))
        result[name] = {"round_trips_per_request": hot / requests,
                        "scripts_per_request": sum(calls.get(c, 0) for c in SCRIPT_COMMANDS) / requests}
    return result


def _process_worker(url: str, namespace: str, tasks: int, seconds: float, rate: float, out: Any) -> None:
    async def run() -> tuple[int, list[float], float, float]:
        session = QueueSession(_queue(url, namespace), _client(url))
        await session.start()
        done, latencies = 0, []
        began = time.time()  # wall clock: comparable across the worker processes
        deadline = time.perf_counter() + seconds

        async def one(index: int) -> None:
            nonlocal done
            spec = TicketSpec(session.new_ticket_id(), f"tenant-{index % 32}", "standard", 300, owner=session.owner)
            started = time.perf_counter()
            await session.admit(spec, timeout_s=30)
            latencies.append((time.perf_counter() - started) * 1000)
            await session.finish(spec.ticket_id, 280)
            done += 1

        if rate > 0:  # open loop at `rate` requests/s
            pending, index, start = set(), 0, time.perf_counter()
            while time.perf_counter() < deadline:
                due = start + index / rate
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                pending.add(asyncio.ensure_future(one(index)))
                index += 1
            await asyncio.gather(*pending)
        else:  # closed loop, `tasks` at a time
            async def loop(index: int) -> None:
                while time.perf_counter() < deadline:
                    await one(index)

            await asyncio.gather(*(loop(i) for i in range(tasks)))
        ended = time.time()
        await session.close()
        return done, latencies, began, ended

    try:
        out.put(asyncio.run(run()))
    except BaseException as exc:  # the parent must hear of it, not wait forever
        out.put(exc)
        raise


def _processes(url: str, namespace: str, processes: int, tasks: int, seconds: float, rate: float) -> tuple[int, list[float], float]:
    out: multiprocessing.Queue = multiprocessing.Queue()
    workers = [multiprocessing.Process(target=_process_worker, args=(url, namespace, tasks, seconds, rate, out))
               for _ in range(processes)]
    for worker in workers:
        worker.start()
    results = [out.get() for _ in workers]
    for worker in workers:
        worker.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    # from the first worker's first request to the last one's end: the workers' start-up is not counted
    elapsed = max(r[3] for r in results) - min(r[2] for r in results)
    return sum(r[0] for r in results), [x for r in results for x in r[1]], elapsed


def throughput(url: str, processes: int, tasks: int, seconds: float) -> dict[str, float]:
    """Grants per second on one Redis with 64 replicas, from several client processes."""
    asyncio.run(_fleet(url, "tput", 64))
    done, latencies, elapsed = _processes(url, "tput", processes, tasks, seconds, 0.0)
    return {"grants_per_s": done / elapsed, "processes": processes, "tasks_per_process": tasks,
            "admit_p50_ms": statistics.median(latencies), "admit_p99_ms": _percentile(latencies, 0.99)}


def paced(url: str, processes: int, rate: float, seconds: float) -> dict[str, float]:
    """Admit latency at an offered rate (requests/s across all processes) with 64 replicas."""
    asyncio.run(_fleet(url, "paced", 64))
    done, latencies, elapsed = _processes(url, "paced", processes, 0, seconds, rate / processes)
    return {"offered_per_s": rate, "completed_per_s": done / elapsed, "admit_p50_ms": statistics.median(latencies),
            "admit_p99_ms": _percentile(latencies, 0.99)}


def bulk_calls(url: str) -> dict[str, float]:
    """The longest single script call (SLOWLOG, µs) in the bulk cases."""
    client = redis.Redis.from_url(url)
    client.config_set("slowlog-log-slower-than", 1000)
    result = {}

    async def reap_dead_gateway() -> None:
        queue = _queue(url, "reap")
        await queue.register_replica(ReplicaCapacity("r", 1, 10**9), lease_ms=3_600_000, now_ms=1_000)
        for index in range(5000):  # a gateway's tickets, all waiting behind one running
            await queue.enqueue(TicketSpec(f"t{index}", f"tenant-{index % 50}", "standard", 10, owner="gw"), now_ms=1_000)
        client.slowlog_reset()
        await queue.expire(now_ms=1_000 + 60_000)  # its leases lapse: one sweep

    async def renew_many() -> None:
        queue = _queue(url, "renew")
        ids = [f"t{index}" for index in range(5064)]
        for ticket_id in ids:
            await queue.enqueue(TicketSpec(ticket_id, "t", "standard", 10, owner="gw"))
        client.slowlog_reset()
        await queue.renew(ids)

    async def register_against_backlog() -> None:
        queue = _queue(url, "burst")
        for index in range(64):
            await queue.register_replica(ReplicaCapacity(f"r{index:02d}", 1, 10**9), lease_ms=3_600_000)
            await queue.enqueue(TicketSpec(f"hold{index}", "h", "standard", 10))
        for index in range(1000):
            await queue.enqueue(TicketSpec(f"b{index}", f"tenant-{index % 100}", "standard", 10))
        client.slowlog_reset()
        await queue.register_replica(ReplicaCapacity("wide", 256, 10**9), lease_ms=3_600_000)

    for name, case in (("reap_5000_us", reap_dead_gateway), ("renew_5064_us", renew_many),
                       ("register_256_slots_at_r64_us", register_against_backlog)):
        asyncio.run(case())
        entries = client.slowlog_get(128)
        result[name] = max((entry["duration"] for entry in entries), default=0)
    client.config_set("slowlog-log-slower-than", 10000)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each throughput run")
    parser.add_argument("--requests", type=int, default=2000, help="requests per cost run")
    parser.add_argument("--processes", type=int, default=2, help="client processes for throughput")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--scripts", action="store_true",
                        help="run the queue's Lua as scripts (EVALSHA) throughout, as on a Redis without functions")
    args = parser.parse_args()
    FUNCTIONS["on"] = not args.scripts
    with tempfile.TemporaryDirectory() as work, running_redis(Path(work)) as url:
        results: dict[str, Any] = {"round_trips": round_trips(url, 300)}
        results["redis_cost"] = [redis_cost(url, r, w, args.requests) for r in (16, 64, 256) for w in (0, 1000)]
        results["redis_cost"] += [redis_cost(url, r, 0, args.requests, pooled=True) for r in (16, 64, 256)]
        if not args.scripts:  # the same fleets through scripts, same run: what functions save
            results["redis_cost"] += [redis_cost(url, r, 0, args.requests, functions=False) for r in (16, 64, 256)]
        results["bulk_calls"] = bulk_calls(url)
        client = redis.Redis.from_url(url)
        client.slowlog_reset()
        results["throughput"] = throughput(url, args.processes, 64, args.seconds)
        results["paced_2000"] = paced(url, args.processes, 2000, args.seconds)
        results["slowlog_over_10ms_under_load"] = len(client.slowlog_get(1000))
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
