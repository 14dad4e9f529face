"""``python -m bench soak --minutes N``: the local deployment under mixed load for N minutes while faults are
injected, ending in a balanced ledger.

The deployment is `deploy/local.yaml` with 2 gateway replicas, 5 s leases and its own Redis. The load
(bench/soak_load.py) mixes short and long completions, streamed chats, clients that time out, clients that
drop a stream half-way and bad bodies, over four tenants and three bands. Every ``--fault-every-s`` one
fault, in turn: a vLLM replica killed (its process tree, as a crash), a gateway replica killed, Redis
restarted empty. After the load stops, the ledger must balance (tests/ledger.py): no ticket left, every
replica's capacity back, every grant ended once. The report gives requests by kind and by status and
reason, the faults and when, and which errors no fault explains (a 5xx or a broken connection more than
``--explain-s`` after every fault).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections import Counter
from pathlib import Path

from bench.headroom import scrape_lag_histogram
from bench.soak_load import Answer, LoadLog, run_load, watch_host
from tests.ledger import assert_ledger_balanced, snapshot
from tests.support.local_redis import RedisProcess
from tests.support.processes import kill, replica_pids
from tests.support.serve_launcher import REPO_ROOT, serve_run

GATEWAYS, REPLICAS, LEASE_S = 2, 2, 5
FAULTS = ("vllm-latency", "gateway", "redis", "vllm-throughput")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--fault-every-s", type=float, default=90)
    parser.add_argument("--explain-s", type=float, default=45, help="errors this soon after a fault are its")
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("bench/results/soak"))
    return parser.parse_args(argv)


def _fleet(redis_url: str) -> tuple[frozenset[str], frozenset[int]]:
    """The registered vLLM replicas and the gateway processes."""
    return (frozenset(r.replica_id for r in snapshot(redis_url).replicas), frozenset(replica_pids("gateway")))


def _recovered(redis_url: str, fault: str | None = None,
               before: tuple[frozenset[str], frozenset[int]] = (frozenset(), frozenset())) -> bool:
    """Every vLLM replica registered and every gateway up, and the part ``fault`` took replaced: a killed
    vLLM replica's registration outlives it until its lease lapses, so a full count alone is not enough.
    (A Redis restart loses every registration, so a full set there is the fleet back.)"""
    replicas, gateways = _fleet(redis_url)
    if len(replicas) != REPLICAS or len(gateways) != GATEWAYS:
        return False
    if fault == "gateway":
        return gateways != before[1]
    if fault is not None and fault.startswith("vllm-"):
        return replicas != before[0]
    return True


async def _inject(fault: str, redis: RedisProcess) -> None:
    if fault == "redis":
        redis.stop()
        await asyncio.sleep(1)
        redis.start()
        return
    pids = replica_pids(fault)
    if pids:
        kill(pids[0])


async def _faults(redis: RedisProcess, args: argparse.Namespace, stop: asyncio.Event, log: LoadLog,
                  injected: list[dict]) -> None:
    index = 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), args.fault_every_s)
            return
        except TimeoutError:
            pass
        fault = FAULTS[index % len(FAULTS)]
        index += 1
        before = await asyncio.to_thread(_fleet, redis.url)
        at = time.monotonic() - log.started
        await _inject(fault, redis)
        recovered = None
        for _ in range(240):  # Serve restarts the replica; the fleet re-registers (bounded wait)
            await asyncio.sleep(0.5)
            if await asyncio.to_thread(_recovered, redis.url, fault, before):
                recovered = time.monotonic() - log.started
                break
        injected.append({"fault": fault, "at_s": round(at, 1),
                         "recovered_after_s": None if recovered is None else round(recovered - at, 1)})


def _label(answer: Answer) -> str:
    return f"{answer.status} {answer.reason}".strip()


def _blame(answer: Answer, injected: list[dict], explain_s: float, stalls: list[dict] = ()) -> str | None:
    """The latest fault at most ``explain_s`` before an error; else "host-stall" when the host froze for a
    second or more in the 15 s before it; else None (unexplained)."""
    before = [f for f in injected if 0 <= answer.at_s - f["at_s"] <= explain_s]
    if before:
        return before[-1]["fault"]
    return "host-stall" if any(0 <= answer.at_s - s["at_s"] <= 15 for s in stalls) else None


def _report(log: LoadLog, injected: list[dict], args: argparse.Namespace, ledger: str) -> dict:
    errors = [a for a in log.answers if a.status >= 500 or (a.status == 0 and a.reason != "client_timeout")]
    by_fault: dict[str, Counter] = {}
    unexplained = []
    for answer in errors:
        fault = _blame(answer, injected, args.explain_s, log.stalls)
        if fault is None:
            unexplained.append(answer)
        else:
            by_fault.setdefault(fault, Counter())[_label(answer)] += 1
    return {"minutes": args.minutes, "requests": len(log.answers),
            "by_kind": dict(Counter(a.kind for a in log.answers)),
            "by_status_and_reason": dict(Counter(_label(a) for a in log.answers)),
            "faults": injected, "errors_by_fault": {f: dict(c) for f, c in by_fault.items()},
            "host_stalls": {"count": len(log.stalls), "longest_s": max((s["lag_s"] for s in log.stalls), default=0),
                            "list": log.stalls[:100]},
            "unexplained_errors": [a.__dict__ for a in unexplained[:50]],
            "unexplained_count": len(unexplained), "ledger": ledger}


async def _soak(url: str, redis: RedisProcess, args: argparse.Namespace) -> tuple[LoadLog, list[dict]]:
    stop, log, injected = asyncio.Event(), LoadLog(), []
    host_done = threading.Event()
    watcher = threading.Thread(target=watch_host, args=(log, host_done), daemon=True)
    watcher.start()
    load = asyncio.create_task(run_load(url, stop, log, args.workers, args.seed))
    faults = asyncio.create_task(_faults(redis, args, stop, log, injected))
    await asyncio.sleep(args.minutes * 60)
    stop.set()
    await asyncio.gather(load, faults)
    host_done.set()
    watcher.join()
    return log, injected


def _gateway_lag(url: str) -> dict[str, float]:
    """The gateways' event-loop lag histogram over the whole soak (cumulative count per upper bound)."""
    return {str(bound): count for bound, count in sorted(scrape_lag_histogram(url).items())}


def main(argv: list[str] | None = None) -> int:
    """Run the soak; write results.json and summary.md; exit 1 if the ledger does not balance."""
    args = _arguments(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "deployment"
    redis = RedisProcess(work / "redis")
    redis.start()

    def edit(app: dict) -> None:
        app["gateway"]["num_replicas"] = GATEWAYS
        app["queue"].update({"lease_s": LEASE_S, "max_wait_s": 30})
        app["access"] = {"allow_anonymous": True, "trust_tenant_header": True}
        app["metrics"] = {"publish_interval_s": 1.0}

    try:
        with serve_run(REPO_ROOT / "deploy" / "local.yaml", work, env={"REDIS_URL": redis.url}, edit=edit,
                       ready=lambda: _recovered(redis.url)) as url:
            log, injected = asyncio.run(_soak(url, redis, args))
            gateway_lag = _gateway_lag(url)
            try:
                assert_ledger_balanced(redis.url, REPLICAS, leases_may_expire=True, timeout_s=120)
                ledger = "balanced"
            except AssertionError as exc:
                ledger = f"NOT balanced: {str(exc)[:300]}"
            events = snapshot(redis.url).stats  # since the last Redis restart
    finally:
        redis.stop()
    report = {**_report(log, injected, args, ledger), "gateway_loop_lag_histogram": gateway_lag,
              "queue_events_since_last_redis_restart": events}
    (args.out / "results.json").write_text(json.dumps(report, indent=1))
    stalls = report["host_stalls"]
    lines = [f"# Soak: {args.minutes:g} minutes, {report['requests']} requests, {len(injected)} faults", "",
             f"Ledger: {ledger}. Errors no fault explains: {report['unexplained_count']}. Host stalls of 1 s or "
             f"more (a thread of the load client woken that late): {stalls['count']}, the longest "
             f"{stalls['longest_s']} s.", "",
             "| answer | count |", "|---|---|"]
    lines += [f"| {key} | {count} |" for key, count in sorted(report["by_status_and_reason"].items())]
    lines += ["", "| fault | at (s) | fleet back after (s) |", "|---|---|---|"]
    lines += [f"| {f['fault']} | {f['at_s']} | {f['recovered_after_s']} |" for f in injected]
    lines += ["", f"Errors within {args.explain_s:g} s after a fault, by the latest such fault:", "",
              "| fault | answers |", "|---|---|"]
    lines += [f"| {fault} | {', '.join(f'{k}: {n}' for k, n in sorted(counts.items()))} |"
              for fault, counts in sorted(report["errors_by_fault"].items())]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ledger == "balanced" else 1


if __name__ == "__main__":
    raise SystemExit(main())
