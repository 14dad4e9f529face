"""The Lua dispatch and the pure-Python reference make the same decisions on the same random workloads.

Each workload interleaves every call (enqueue, replica registration and expiry, engine signal reports that
acknowledge some grants and top up requests past their charge, completion with actual costs, cancellation,
requeue, lease renewal, time passing past leases, signal staleness and aging limits; tickets in several flows
per tenant; replicas that prefer some length classes) and compares every result, then the full state (tenant and flow counters bit for bit,
queue depths per band and tenant, replica capacity, in-flight credit and signal freshness).
"""

from __future__ import annotations

import random
import uuid

from typing import Any

import pytest
import redis.asyncio as aioredis

from fleet.keys import QueueKeys
from fleet.blocking import blocking
from fleet.queue import GlobalQueue, QueueSettings
from policies.placement import guarded_classes
from policies.reference_scheduler import ReferenceScheduler
from policies.types import BandPolicy, EngineSignals, ReplicaCapacity, TicketSpec
from tests.support.local_redis import has_functions

pytestmark = pytest.mark.integration

BANDS = (
    BandPolicy("interactive", aging_ms=0, max_queued=40, max_queued_tokens=8000, tenant_share=0.5,
               max_unstarted_steps=3.0, kv_ceiling=0.95),
    BandPolicy("standard", aging_ms=900, max_queued=40, max_queued_tokens=8000, max_unstarted_steps=1.5, kv_ceiling=0.85),
    BandPolicy("batch", aging_ms=1500, max_queued=30, max_queued_tokens=6000, tenant_share=0.09,
               max_unstarted_steps=1.0, kv_ceiling=0.6),  # a tenant's share: 2 tickets, 540 tokens
)
LEASE_MS = 4000
STALE_MS = 300  # short, so signals go stale (and the gate falls back) often
TENANTS = ["acme", "blue", "core", "delta"]
FLOWS = ["", "", "chat", "batch-job"]
WEIGHTS = {"acme": 1.0, "blue": 2.0, "core": 0.5, "delta": 3.0}


def _queues(redis_url: str, use_functions: bool = True) -> tuple[Any, ReferenceScheduler]:
    keys = QueueKeys(namespace=f"t{uuid.uuid4().hex[:12]}")
    # small per-call bounds, so that calls which stop at them (and the ones that pick up after) are compared too
    # two waiting flows per tenant at most, so tickets of a third join the overflow flow
    settings = QueueSettings(BANDS, lease_ms=LEASE_MS, max_grants=5, bulk_limit=3, signal_stale_ms=STALE_MS,
                             max_flows=2)
    lua = blocking(lambda: GlobalQueue(aioredis.Redis.from_url(redis_url), keys, settings, use_functions=use_functions))
    return lua, ReferenceScheduler(list(BANDS), max_grants_per_dispatch=5, bulk_limit=3, signal_stale_ms=STALE_MS,
                                   max_flows=2)


def _signals(rng: random.Random) -> EngineSignals:
    # few distinct values, so the gate's limits are met exactly as often as not
    return EngineSignals(unstarted=rng.randint(0, 3), unstarted_tokens=rng.choice([0, 100, 300, 450, 900]),
                         running=rng.randint(0, 4), waiting=rng.randint(0, 2),
                         kv_usage=rng.choice([0.0, 0.3, 0.6, 0.85, 0.95, 0.99]), received=rng.randint(0, 99))


def _replica(rng: random.Random, replica_id: str, fleet: str, reserve: int = 0) -> ReplicaCapacity:
    if fleet == "identical":  # every placement is decided by the tie-break
        return ReplicaCapacity(replica_id, slots_total=3, tokens_total=600, step_tokens=200)
    if fleet == "pools":  # a latency pool that guards long prompts beside a throughput pool built for them
        latency = rng.random() < 0.6
        prefers = frozenset({"short"} if latency else {"long"})
        return ReplicaCapacity(replica_id, slots_total=rng.randint(2, 4), tokens_total=rng.choice([600, 1500]),
                               prefers=prefers, pool="latency" if latency else "throughput",
                               guarded=guarded_classes({"short", "long"}, prefers, ["short", "long"]),
                               step_tokens=rng.choice([100, 200]), prefill_chunk=rng.choice([0, 50]),
                               reserve=reserve if latency else 0)
    accepts = rng.choice([frozenset({"short", "long"}), frozenset({"short"}), frozenset({"long"})])
    prefers = frozenset(c for c in accepts if rng.random() < 0.4)
    # few distinct sizes, so placement ties (and their tie-break) happen often
    return ReplicaCapacity(replica_id, slots_total=rng.randint(1, 4), tokens_total=rng.choice([300, 600, 1500]),
                           accepts=accepts, prefers=prefers, pool=rng.choice(["latency", "throughput"]),
                           guarded=guarded_classes(accepts, prefers, ["short", "long"]),
                           step_tokens=rng.choice([100, 200]), reserve=reserve)


def _state_matches(lua: Any, ref: ReferenceScheduler, now: int) -> int:
    """Compare the whole state; returns how many replicas the gate closes to some band by their signals."""
    snapshot = lua.snapshot(now)
    for band in snapshot.bands:
        assert (band.queued, band.queued_tokens) == ref.queued(band.name)
        for tenant, value in band.counters.items():
            assert value == ref.counter(band.name, tenant), (band.name, tenant)
        depth = {t: (d.queued, d.queued_tokens) for t, d in band.tenants.items()}
        assert depth == ref.waiting_by_tenant(band.name)
        for tenant in TENANTS:
            raw = lua.run(lua.client.hgetall(lua.keys.flow_counters(band.name, tenant)))
            flows = {flow.decode(): float(value) for flow, value in raw.items()}
            for flow in [*FLOWS, "~"]:
                want = ref.flow_counter(band.name, tenant, flow)
                assert flows.get(flow, None if want is None else 0.0) == want, (band.name, tenant, flow)
    lua_replicas = {r.replica_id: (r.slots_free, r.tokens_free, r.in_flight, r.in_flight_tokens, r.fresh,
                                   r.guarded_held) for r in snapshot.replicas}
    assert lua_replicas == {r.replica_id: (r.slots_free, r.tokens_free, r.in_flight, r.in_flight_tokens, r.fresh,
                                           r.guarded_held) for r in ref.replicas.values()}
    assert snapshot.tickets == len(ref.tickets)
    assert snapshot.served == ref.served
    return sum(1 for r in snapshot.replicas if r.fresh and r.slots_free > 0 and len(r.open_bands) < len(BANDS))


@pytest.mark.parametrize("fleet", ["mixed", "identical", "pools"], ids=lambda fleet: f"{fleet}-replicas")
@pytest.mark.parametrize("seed", range(14))
def test_random_workload_same_decisions(redis_url: str, seed: int, fleet: str) -> None:
    _same_decisions(redis_url, seed, fleet, use_functions=True)  # scripts where the server has no functions


@pytest.mark.parametrize("seed", range(3))
def test_random_workload_same_decisions_as_scripts(redis_url: str, seed: int) -> None:
    _same_decisions(redis_url, seed, "pools", use_functions=False)


def _same_decisions(redis_url: str, seed: int, fleet: str, use_functions: bool) -> None:
    rng = random.Random(seed)
    lua, ref = _queues(redis_url, use_functions)
    now = 1_000_000
    granted: list[str] = []
    waiting: list[str] = []
    replica_ids = [f"replica-{i}" for i in range(3)]
    decisions = gated = guarded = topped_up = 0

    for step in range(260):
        now += rng.choice([0, 0, 5, 20, 80, 250])
        op = rng.random()
        if op < 0.45:
            spec = TicketSpec(
                ticket_id=f"s{seed}-{step}", tenant=rng.choice(TENANTS), band=rng.choice(BANDS).name,
                cost=rng.randint(1, 600), weight=0, length_class=rng.choice(["short", "short", "long"]),
                flow=rng.choice(FLOWS), prompt_tokens=rng.choice([0, 40, 250]),
                ceiling=rng.choice(["", "", "interactive", "standard", "batch"]),
            )
            spec = TicketSpec(**{**spec.__dict__, "weight": WEIGHTS[spec.tenant]})
            got = lua.enqueue(spec, now)
            assert got == ref.enqueue(spec, now, LEASE_MS)
            if got.admitted:
                waiting.append(spec.ticket_id)
            outcome = got.grants
        elif op < 0.52 and rng.random() < 0.15:  # a replica leaves (its grants' capacity is not its next one's)
            replica_id, hold_ms = rng.choice(replica_ids), rng.choice([0, 0, 100, 2_000])  # held out: unreachable
            outcome = lua.deregister_replica(replica_id, now, hold_ms=hold_ms)
            assert outcome == ref.deregister_replica(replica_id, now, hold_ms=hold_ms)
        elif op < 0.52:
            replica_id = rng.choice(replica_ids)  # odd seeds: a reserve of one replica free of guarded work
            # (replica-0 has none: a group's replicas differ while a config change rolls out)
            replica = _replica(rng, replica_id, fleet, reserve=seed % 2 if replica_id != "replica-0" else 0)
            outcome = lua.register_replica(replica, LEASE_MS, now)
            assert outcome == ref.register_replica(replica, now, LEASE_MS)
        elif op < 0.64 or step % 40 == 39:  # a replica reports; it acknowledges some grants (its own, others',
            replica_id, signals = rng.choice(replica_ids), _signals(rng)  # gone ones); now and then a busy one
            if step % 40 == 39:
                signals = EngineSignals(unstarted_tokens=450, kv_usage=0.9)
            received = [t for t in granted + ["no-such-ticket"] if rng.random() < 0.5]
            # and the progress of some running requests (its own, others', gone ones), some past their charge
            own = {t for t in granted if t in ref.tickets and ref.tickets[t].granted_to == replica_id}
            progress = [(t, rng.randint(0, 2 * ref.tickets[t].spec.cost) if t in ref.tickets else 9)
                        for t in granted + ["no-such-ticket"] if rng.random() < (0.7 if t in own else 0.15)]
            before = {t: ref.tickets[t].topped for t, _ in progress if t in ref.tickets}
            outcome = lua.report_signals(replica_id, signals, received, now, progress=progress)
            assert outcome == ref.report_signals(replica_id, signals, received, now, progress=progress)
            topped_up += sum(ref.tickets[t].topped > was for t, was in before.items() if t in ref.tickets)
        elif op < 0.75 and granted:
            ticket_id = granted.pop(rng.randrange(len(granted)))
            ticket = ref.tickets.get(ticket_id)
            actual = rng.randint(0, ticket.charged + 50) if ticket else 1
            result = lua.complete(ticket_id, actual, now)
            assert result == ref.complete(ticket_id, actual, now)
            outcome = result.grants
        elif op < 0.82 and waiting:
            ticket_id = waiting.pop(rng.randrange(len(waiting)))
            result = lua.cancel(ticket_id, now)
            assert result == ref.cancel(ticket_id, now)
            outcome = result.grants
            if result.status == "granted":
                granted.append(ticket_id)
        elif op < 0.86 and granted:
            ticket_id = rng.choice(granted)
            result = lua.requeue(ticket_id, now)
            assert result == ref.requeue(ticket_id, now)
            outcome = result.grants
        elif op < 0.93:
            alive = [t for t in waiting + granted if rng.random() < 0.8]
            assert lua.renew(alive, now) == ref.renew(alive, now, LEASE_MS)
            outcome = []
        else:
            now += rng.choice([1000, 2000, 4500])  # past aging limits, sometimes past leases
            outcome = lua.expire(now)
            assert outcome == ref.expire(now)
        for grant in outcome:
            decisions += 1
            guarded += ref.tickets[grant.ticket_id].guarded if grant.ticket_id in ref.tickets else 0
            if grant.ticket_id in waiting:
                waiting.remove(grant.ticket_id)
            granted.append(grant.ticket_id)
        granted = [t for t in dict.fromkeys(granted) if t in ref.tickets]
        waiting = [t for t in waiting if t in ref.tickets]
        gated += _state_matches(lua, ref, now)
    assert decisions > 20, "the workload should exercise dispatch"
    assert gated > 0, "the workload should exercise the gate's signal limits"
    assert topped_up > 0, "the workload should top up requests that ran past their charge"
    assert lua.lua.form == ("functions" if use_functions and has_functions(redis_url) else "scripts")
    if fleet == "pools":
        assert guarded > 0, "the workload should put long prompts on latency replicas"
