"""A running request that passes its estimate is charged as it runs (the reference; the Lua agrees).

A request's estimate (its prompt and ``max_tokens``, or ``default_output_tokens`` without one) is charged at
its grant; its replica reports what the engine has served past that, and the tenant is topped up. Completion
still charges exactly what was served, once; a requeue refunds everything charged. Without top-ups a tenant
whose requests run far past their estimates keeps winning grants until they end.
"""

from __future__ import annotations

from collections import Counter

from policies.reference_scheduler import ReferenceScheduler
from policies.types import BandPolicy, EngineSignals, ReplicaCapacity, TicketSpec

LEASE = 10**12


def _scheduler(slots: int = 1, replicas: tuple[str, ...] = ("r",)) -> ReferenceScheduler:
    scheduler = ReferenceScheduler([BandPolicy("only")], signal_stale_ms=LEASE)
    for replica in replicas:
        scheduler.register_replica(ReplicaCapacity(replica, slots_total=slots, tokens_total=10**9), 0, LEASE)
    return scheduler


def test_a_top_up_moves_the_next_grant_to_the_other_tenant() -> None:
    scheduler = _scheduler(slots=2)
    for ticket, tenant in (("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b")):
        scheduler.enqueue(TicketSpec(ticket, tenant, "only", 100, 1.0), 0, LEASE)
    assert scheduler.counter("only", "a") == scheduler.counter("only", "b") == 100  # a1, b1 run
    scheduler.report_signals("r", EngineSignals(), ["a1", "b1"], 1, progress=[("a1", 900), ("b1", 60)])
    assert scheduler.counter("only", "a") == 900 and scheduler.counter("only", "b") == 100
    _, grants = scheduler.complete("b1", 100, 2)
    assert [g.ticket_id for g in grants] == ["b2"]  # without the top-up: a tie, and "a" goes first


def test_completion_charges_what_was_served_once_whatever_was_topped_up() -> None:
    scheduler = _scheduler()
    scheduler.enqueue(TicketSpec("t", "a", "only", 100, 2.0), 0, LEASE)
    for served in (300, 250, 500):  # a lower count than already charged refunds nothing while it runs
        scheduler.report_signals("r", EngineSignals(), ["t"], 1, progress=[("t", served)])
    assert scheduler.counter("only", "a") == 500 / 2.0
    scheduler.complete("t", 420, 2)  # it served less in the end than its last report said: corrected
    assert scheduler.counter("only", "a") == 420 / 2.0 and scheduler.served == {"a": 420}


def test_progress_is_ignored_unless_the_reporting_replica_holds_the_grant() -> None:
    scheduler = _scheduler(replicas=("r", "s"))
    scheduler.enqueue(TicketSpec("t", "a", "only", 100, 1.0), 0, LEASE)
    holder = scheduler.tickets["t"].granted_to
    other = "s" if holder == "r" else "r"
    scheduler.enqueue(TicketSpec("w", "a", "only", 100, 1.0), 0, LEASE)  # granted too (two replicas)
    scheduler.enqueue(TicketSpec("x", "b", "only", 100, 1.0), 0, LEASE)  # waits
    before = scheduler.counter("only", "a"), scheduler.counter("only", "b")
    scheduler.report_signals(other, EngineSignals(), [], 1, progress=[("t", 5000), ("x", 5000), ("gone", 5000)])
    assert (scheduler.counter("only", "a"), scheduler.counter("only", "b")) == before


def test_a_requeue_refunds_the_top_ups_and_the_next_grant_charges_the_estimate() -> None:
    scheduler = _scheduler(replicas=("r", "s"))
    scheduler.enqueue(TicketSpec("t", "a", "only", 100, 1.0), 0, LEASE)
    holder = scheduler.tickets["t"].granted_to
    scheduler.report_signals(holder, EngineSignals(), ["t"], 1, progress=[("t", 700)])
    scheduler.deregister_replica(holder, 2)  # its replica is gone before the gateway heard of it
    scheduler.requeue("t", 3)
    assert scheduler.tickets["t"].granted_to not in (None, holder)  # granted again, on the other replica
    assert scheduler.counter("only", "a") == 100 and scheduler.tickets["t"].charged == 100


def _grants_and_tokens(report_progress: bool) -> tuple[Counter, Counter]:
    """Two backlogged tenants on one replica of 16 slots, every request serving 10 tokens a step. "honest"
    asks for 100 tokens and says so; "greedy" runs to 1,000 and says 40 (no max_tokens: the default
    estimate). The replica reports each step. Over one greedy request's life: the grants each tenant got
    after the first wave, and the tokens each was served."""
    scheduler = _scheduler(slots=16)
    lengths = {"greedy": 1000, "honest": 100}
    for index in range(200):
        for tenant, estimate in (("greedy", 40), ("honest", 100)):
            scheduler.enqueue(TicketSpec(f"{tenant}{index:03}", tenant, "only", estimate, 1.0), 0, LEASE)
    served: dict[str, int] = {}
    grants: Counter = Counter()
    tokens: Counter = Counter()
    for now in range(1, 101):
        running = [t for t, record in scheduler.tickets.items() if record.granted_to]
        for ticket in running:
            served[ticket] = served.get(ticket, 0) + 10
            tokens[scheduler.tickets[ticket].spec.tenant] += 10
        progress = [(t, served[t]) for t in running] if report_progress else []
        scheduler.report_signals("r", EngineSignals(), running, now, progress=progress)
        for ticket in running:
            if served[ticket] == lengths[scheduler.tickets[ticket].spec.tenant]:
                for grant in scheduler.complete(ticket, served[ticket], now).grants:
                    grants[scheduler.tickets[grant.ticket_id].spec.tenant] += 1
    return grants, tokens


def test_top_ups_give_the_slots_that_free_up_to_the_tenant_that_was_served_less() -> None:
    """The first wave is placed by the estimates alone (a running request is never preempted), so "greedy"
    keeps the slots it won first; top-ups decide the slots that free up after it."""
    (grants, tokens), (topped_grants, topped_tokens) = _grants_and_tokens(False), _grants_and_tokens(True)
    assert tokens["greedy"] > 10 * tokens["honest"]  # without: "greedy" ends up holding almost every slot
    assert topped_grants["honest"] > 10 * topped_grants["greedy"]
    assert topped_tokens["honest"] > 4 * tokens["honest"]
