"""Properties of the global scheduler (the reference; the Lua scripts agree with it decision for decision).

* Fairness (VTC): two continuously backlogged tenants' weighted service never differs by more than 2x the
  largest weighted request cost, over any interval; flows inside a tenant share its service within 2x the
  largest cost, and splitting a tenant into flows does not change the tenant bound.
* Strict bands: every grant comes from the highest band that has a waiting ticket; a ticket of a lower
  original band overtakes a waiting higher-band ticket only after waiting its band's aging limit.
* No ticket is granted twice (unless requeued); capacity never goes negative or above what was
  registered, and free + reserved always equals the registered total.

All of these hold with the gate at work: the random operations include engine signal reports (replicas
close to lower bands, then go stale), and the fairness replays run once more with a gated replica. The gate's
own properties are in test_gate_properties.py.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.reference_scheduler import ReferenceScheduler
from policies.types import BandPolicy, EngineSignals, ReplicaCapacity, TicketSpec

LEASE = 10**12  # leases never expire in these properties
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 0.5, "d": 1.0}

arrivals = st.lists(
    st.tuples(st.integers(0, 30), st.sampled_from(sorted(WEIGHTS)), st.integers(1, 400)),
    min_size=20, max_size=200,
)


class _GapTracker:
    """Spans of a service difference over intervals in which both sides stay backlogged."""

    def __init__(self) -> None:
        self._spans: dict[tuple, list[float]] = {}

    def sample(self, key: tuple, backlogged_before: bool, backlogged_after: bool, diff: float, limit: float) -> None:
        """``diff`` after a grant; both sides were backlogged just before it, and still are after it, or not."""
        if backlogged_before:
            span = self._spans.setdefault(key, [])
            span.append(diff)
            assert max(span) - min(span) <= limit + 1e-9, (key, span)
        if not backlogged_after:  # one side went idle: its next busy period starts a new interval
            self._spans.pop(key, None)


def _replay(specs_by_step: dict[int, list[TicketSpec]], slots: int, on_grant, gate: int = 0) -> None:
    """One replica of ``slots`` slots; every grant runs for one step, so bursts leave tenants backlogged.
    With ``gate`` > 0 the replica reports its engine every step, and the band lets it hold ``gate`` steps of
    100 tokens unstarted (its grants of a step start the next one).

    ``on_grant(spec, waiting_before, waiting_after)`` hears every grant in order, with the tickets that were
    waiting just before it (those still waiting after the call, plus the ones the same call granted from it
    on) and just after it.
    """
    scheduler = ReferenceScheduler([BandPolicy("only", max_unstarted_steps=gate or 4)], signal_stale_ms=LEASE)
    scheduler.register_replica(ReplicaCapacity("r", slots_total=slots, tokens_total=10**9, step_tokens=100), 0, LEASE)
    tenants = sorted({spec.tenant for specs in specs_by_step.values() for spec in specs})

    def granted(grants) -> list[str]:
        specs = [scheduler.tickets[grant.ticket_id].spec for grant in grants]
        still_waiting = [scheduler.tickets[t].spec for tenant in tenants for t in scheduler.waiting_ids("only", tenant)]
        for index, spec in enumerate(specs):
            on_grant(spec, still_waiting + specs[index:], still_waiting + specs[index + 1:])
        return [grant.ticket_id for grant in grants]

    running: list[str] = []
    step = 0
    while step <= max(specs_by_step, default=0) or scheduler.tickets:
        started = []
        for ticket_id in running:
            started += granted(scheduler.complete(ticket_id, scheduler.tickets[ticket_id].spec.cost, step)[1])
        for spec in specs_by_step.get(step, []):
            started += granted(scheduler.enqueue(spec, step, LEASE)[1])
        if gate:  # what was granted this step has not started yet
            tokens = sum(scheduler.tickets[t].spec.prefill_tokens for t in started)
            signals = EngineSignals(unstarted=len(started), unstarted_tokens=tokens)
            started += granted(scheduler.report_signals("r", signals, started, step))
        running = started
        step += 1


@settings(max_examples=200, deadline=None)
@given(arrivals=arrivals, slots=st.integers(1, 3), gate=st.sampled_from([0, 1, 2]))
def test_backlogged_tenants_weighted_service_gap_is_bounded(arrivals, slots, gate) -> None:
    by_step = defaultdict(list)
    for index, (step, tenant, cost) in enumerate(arrivals):
        by_step[step].append(TicketSpec(f"t{index}", tenant, "only", cost, WEIGHTS[tenant]))
    bound = 2 * max(cost / WEIGHTS[tenant] for _, tenant, cost in arrivals)
    service = dict.fromkeys(WEIGHTS, 0.0)
    gaps = _GapTracker()

    def on_grant(spec: TicketSpec, waiting_before: list[TicketSpec], waiting_after: list[TicketSpec]) -> None:
        service[spec.tenant] += spec.cost / WEIGHTS[spec.tenant]
        before, after = {s.tenant for s in waiting_before}, {s.tenant for s in waiting_after}
        for i in WEIGHTS:
            for j in WEIGHTS:
                if i < j:
                    gaps.sample((i, j), {i, j} <= before, {i, j} <= after, service[i] - service[j], bound)

    _replay(by_step, slots, on_grant, gate)


flow_arrivals = st.lists(
    st.tuples(st.integers(0, 30), st.sampled_from(["a", "b"]), st.sampled_from(["", "x", "y"]), st.integers(1, 400)),
    min_size=20, max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(arrivals=flow_arrivals, slots=st.integers(1, 3))
def test_flows_share_their_tenant_fairly_without_changing_the_tenant_bound(arrivals, slots) -> None:
    """Tenant "a" splits its work over flows; inside "a", backlogged flows' service gap stays within 2x the
    largest cost, and "a" against "b" keeps the tenant bound whatever flows "a" uses."""
    by_step = defaultdict(list)
    for index, (step, tenant, flow, cost) in enumerate(arrivals):
        by_step[step].append(TicketSpec(f"t{index}", tenant, "only", cost, WEIGHTS[tenant], flow=flow))
    bound = 2 * max(cost / WEIGHTS[tenant] for _, tenant, _, cost in arrivals)
    flow_bound = 2 * max(cost for _, _, _, cost in arrivals)
    service: dict[tuple[str, str], float] = defaultdict(float)
    gaps = _GapTracker()

    def on_grant(spec: TicketSpec, waiting_before: list[TicketSpec], waiting_after: list[TicketSpec]) -> None:
        service[(spec.tenant, spec.flow)] += spec.cost
        weighted = {t: sum(v for (tt, _), v in service.items() if tt == t) / WEIGHTS[t] for t in "ab"}
        before, after = {s.tenant for s in waiting_before}, {s.tenant for s in waiting_after}
        gaps.sample(("a", "b"), before == {"a", "b"}, after == {"a", "b"}, weighted["a"] - weighted["b"], bound)
        flows_before = {s.flow for s in waiting_before if s.tenant == "a"}
        flows_after = {s.flow for s in waiting_after if s.tenant == "a"}
        for i, j in [("", "x"), ("", "y"), ("x", "y")]:
            gaps.sample((i, j), {i, j} <= flows_before, {i, j} <= flows_after,
                        service[("a", i)] - service[("a", j)], flow_bound)

    _replay(by_step, slots, on_grant)


BANDS = [BandPolicy("high", max_unstarted_steps=3.0, kv_ceiling=0.95),
         BandPolicy("mid", aging_ms=50, max_unstarted_steps=2.0, kv_ceiling=0.8),
         BandPolicy("low", aging_ms=80, max_unstarted_steps=1.0, kv_ceiling=0.6)]
STALE_MS = 40
RANK = {band.name: index for index, band in enumerate(BANDS)}
AGING = {band.name: band.aging_ms for band in BANDS}

_enqueue = st.tuples(st.just("enqueue"), st.sampled_from(["high", "mid", "low"]), st.sampled_from(sorted(WEIGHTS)),
                    st.integers(1, 300), st.sampled_from(["short", "long"]))
_complete = st.tuples(st.just("complete"), st.integers(0, 10**6), st.integers(0, 300))
operations = st.lists(
    st.one_of(  # weighted towards arrivals, so queues build up and bands compete
        _enqueue, _enqueue, _enqueue, _complete, _complete,
        st.tuples(st.just("cancel"), st.integers(0, 10**6)),
        st.tuples(st.just("requeue"), st.integers(0, 10**6)),
        st.tuples(st.just("tick"), st.integers(1, 60)),
        st.tuples(st.just("report"), st.integers(0, 9), st.integers(0, 3), st.sampled_from([0.1, 0.7, 0.9, 0.99])),
    ),
    min_size=20, max_size=200,
)


def _check_capacity(scheduler: ReferenceScheduler) -> None:
    reserved = Counter()
    for ticket in scheduler.tickets.values():
        if ticket.granted_to:
            reserved[ticket.granted_to] += ticket.reserved_tokens
    for replica in scheduler.replicas.values():
        assert 0 <= replica.slots_free <= replica.slots_total
        assert 0 <= replica.tokens_free <= replica.tokens_total
        assert replica.tokens_free + reserved[replica.replica_id] == replica.tokens_total


def _run(ops, replicas: list[ReplicaCapacity], on_grants) -> None:
    """Apply random operations; after each call, hand its grants to ``on_grants`` and check capacity."""
    scheduler = ReferenceScheduler(BANDS, signal_stale_ms=STALE_MS)
    now = 0
    for replica in replicas:
        scheduler.register_replica(replica, now, LEASE)
    arrived: dict[str, tuple[str, int]] = {}
    for index, op in enumerate(ops):
        granted_ids = sorted(tid for tid, t in scheduler.tickets.items() if t.granted_to)
        waiting_ids = sorted(tid for tid, t in scheduler.tickets.items() if not t.granted_to)
        grants, requeued = [], None
        if op[0] == "enqueue":
            _, band, tenant, cost, length_class = op
            spec = TicketSpec(f"t{index}", tenant, band, cost, WEIGHTS[tenant], length_class)
            result = scheduler.enqueue(spec, now, LEASE)
            grants = result.grants
            if result.admitted:
                arrived[spec.ticket_id] = (band, now)
        elif op[0] == "complete" and granted_ids:
            _, grants = scheduler.complete(granted_ids[op[1] % len(granted_ids)], op[2], now)
        elif op[0] == "requeue" and granted_ids:
            requeued = granted_ids[op[1] % len(granted_ids)]
            _, grants = scheduler.requeue(requeued, now)
        elif op[0] == "cancel" and waiting_ids:
            grants = scheduler.cancel(waiting_ids[op[1] % len(waiting_ids)], now).grants
        elif op[0] == "tick":
            now += op[1]
            grants = scheduler.expire(now)
        elif op[0] == "report":  # a replica reports its engine and acknowledges what it was granted
            replica = replicas[op[1] % len(replicas)].replica_id
            received = [tid for tid in granted_ids if scheduler.tickets[tid].granted_to == replica]
            signals = EngineSignals(unstarted=op[2], unstarted_tokens=op[2] * 1500, kv_usage=op[3])
            grants = scheduler.report_signals(replica, signals, received, now)
        on_grants(scheduler, grants, arrived, now, requeued)
        _check_capacity(scheduler)


@settings(max_examples=200, deadline=None)
@given(ops=operations)
def test_no_double_grant_and_capacity_conserved(ops) -> None:
    grants_of, requeues_of = Counter(), Counter()

    def on_grants(scheduler, grants, arrived, now, requeued) -> None:
        if requeued:
            requeues_of[requeued] += 1
        for grant in grants:
            grants_of[grant.ticket_id] += 1
            assert grants_of[grant.ticket_id] <= 1 + requeues_of[grant.ticket_id], "granted twice"

    _run(ops, [ReplicaCapacity("r1", 2, 500, frozenset({"short", "long"})),
               ReplicaCapacity("r2", 1, 300, frozenset({"short"}))], on_grants)


@settings(max_examples=200, deadline=None)
@given(ops=operations)
def test_higher_bands_first_except_aged(ops) -> None:
    # every ticket fits every replica with a free slot, so strictness is the only ordering constraint
    ops = [(op[0], op[1], op[2], op[3], "short") if op[0] == "enqueue" else op for op in ops]

    def on_grants(scheduler, grants, arrived, now, requeued) -> None:
        still_waiting = [t for t in scheduler.tickets.values() if not t.granted_to]
        for grant in grants:
            original, arrived_at = arrived[grant.ticket_id]
            assert RANK[grant.band] <= RANK[original], "a ticket is only ever promoted"
            for other in still_waiting:
                assert RANK[other.band] >= RANK[grant.band], "a waiting higher band was overtaken"
                if RANK[arrived[other.spec.ticket_id][0]] < RANK[original]:
                    assert now - arrived_at >= AGING[original], "overtook a higher band without aging"

    _run(ops, [ReplicaCapacity("r1", 2, 10**9), ReplicaCapacity("r2", 1, 10**9)], on_grants)


def test_aging_stops_at_the_tenants_ceiling() -> None:
    """A batch-etl ticket (ceiling "standard") ages into standard and no further; one without a ceiling
    goes on to the top band. No replica, so nothing is granted while they age."""
    scheduler = ReferenceScheduler(BANDS)
    scheduler.enqueue(TicketSpec("capped", "etl", "low", 10, ceiling="mid"), 0, LEASE)
    scheduler.enqueue(TicketSpec("free", "etl", "low", 10), 0, LEASE)
    for now in range(0, 1000, 10):
        scheduler.expire(now)
    assert scheduler.tickets["capped"].band == "mid"
    assert scheduler.tickets["free"].band == "high"


def test_one_tenant_cannot_fill_a_band_and_lock_the_others_out() -> None:
    scheduler = ReferenceScheduler([BandPolicy("only", max_queued=10, tenant_share=0.5)])  # no replica: all wait
    flood = [scheduler.enqueue(TicketSpec(f"f{i}", "flood", "only", 10), 0, LEASE).status for i in range(10)]
    assert flood == ["admitted"] * 5 + ["tenant_queue_full"] * 5
    assert scheduler.enqueue(TicketSpec("calm", "calm", "only", 10), 0, LEASE).status == "admitted"
