"""Properties of the gate and work-conserving placement (the reference; the Lua agrees decision for decision).

* No grant to a saturated replica: a replica with current signals gets a band's ticket only while its
  pending prompt tokens (unstarted + in flight) are below the band's steps of its budget and its KV usage
  below the band's ceiling, so after any call its pending work is below the largest limit of the bands it
  was granted plus one ticket.
* Work conservation: after every call, no waiting ticket could be placed on any replica the gate leaves
  open to its band (dispatch stops only when nothing more fits).
* A guarded class (longer than a replica's pool is built for) goes there only while the replica holds none of
  the work it is built for and what it has not started fits in one step: a long prompt never lands on a
  latency replica that is serving short requests.
* Late reports cannot overshoot: grants count as in flight until acknowledged, so however many grants a
  replica gets between two reports, its pending work never passes the top band's limit.
* Stale signals fall back to the concurrency cap: dispatch continues, bounded by slots.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.gate import gate_open, pending
from policies.placement import fits, group_loads, group_of, takes_guarded
from policies.reference_scheduler import ReferenceScheduler
from policies.types import BandPolicy, EngineSignals, ReplicaCapacity, TicketSpec

LEASE = 10**12
STALE_MS = 50
BANDS = [BandPolicy("interactive", max_unstarted_steps=3.0, kv_ceiling=0.95),
         BandPolicy("standard", aging_ms=200, max_unstarted_steps=2.0, kv_ceiling=0.85),
         BandPolicy("batch", aging_ms=400, max_unstarted_steps=1.5, kv_ceiling=0.7)]
LIMITS = {band.name: band for band in BANDS}


def _fleet(reserve: int = 0) -> list[ReplicaCapacity]:
    latency = [ReplicaCapacity(f"lat{i}", 8, 5_000, frozenset({"short", "long"}), "latency", frozenset({"short"}),
                               frozenset({"long"}), step_tokens=400, reserve=reserve) for i in range(2)]
    throughput = [ReplicaCapacity(f"thr{i}", 8, 5_000, frozenset({"short", "long"}), "throughput",
                                  frozenset({"long"}), step_tokens=1600) for i in range(2)]
    return latency + throughput


_enqueue = st.tuples(st.just("enqueue"), st.sampled_from([b.name for b in BANDS]), st.sampled_from("abc"),
                     st.integers(1, 900), st.sampled_from(["short", "short", "long"]))
operations = st.lists(
    st.one_of(
        _enqueue, _enqueue, _enqueue,
        st.tuples(st.just("complete"), st.integers(0, 10**6)),
        st.tuples(st.just("report"), st.integers(0, 3), st.integers(0, 3000), st.sampled_from([0.1, 0.75, 0.9, 0.99]),
                  st.booleans()),
        st.tuples(st.just("tick"), st.integers(1, 80)),
    ),
    min_size=30, max_size=250,
)


def _placeable(scheduler: ReferenceScheduler) -> list[tuple[str, str]]:
    """(ticket, replica) pairs where a waiting ticket could run now on a replica open to its band (and, for
    a guarded class, its group keeps its reserve)."""
    loads = group_loads(scheduler.replicas.values())
    return [(t.spec.ticket_id, r.replica_id)
            for t in scheduler.tickets.values() if t.granted_to is None
            for r in scheduler.replicas.values()
            if gate_open(r, LIMITS[t.band]) and fits(r, t.spec.cost, t.spec.length_class, loads[group_of(r)])]


def _apply(scheduler: ReferenceScheduler, op: tuple, index: int, now: int) -> tuple[list, int]:
    granted = sorted(tid for tid, t in scheduler.tickets.items() if t.granted_to)
    if op[0] == "enqueue":
        _, band, tenant, cost, length_class = op
        return scheduler.enqueue(TicketSpec(f"t{index}", tenant, band, cost, 1.0, length_class), now, LEASE).grants, now
    if op[0] == "complete" and granted:
        return scheduler.complete(granted[op[1] % len(granted)], 10, now).grants, now
    if op[0] == "report":
        _, which, unstarted_tokens, kv, acknowledge = op
        replica = sorted(scheduler.replicas)[which % len(scheduler.replicas)]
        received = [tid for tid in granted if scheduler.tickets[tid].granted_to == replica] if acknowledge else []
        signals = EngineSignals(unstarted_tokens=unstarted_tokens, kv_usage=kv)
        return scheduler.report_signals(replica, signals, received, now), now
    if op[0] == "tick":
        return scheduler.expire(now + op[1]), now + op[1]
    return [], now


def _run(ops, check, reserve: int = 0, throughput: int = 2) -> None:
    scheduler = ReferenceScheduler(BANDS, signal_stale_ms=STALE_MS)
    for replica in _fleet(reserve)[:2 + throughput]:
        scheduler.register_replica(replica, 0, LEASE)
    now = 0
    for index, op in enumerate(ops):
        before = {r.replica_id: (r.fresh, pending(r), r.signals.kv_usage) for r in scheduler.replicas.values()}
        grants, now = _apply(scheduler, op, index, now)
        check(scheduler, grants, before)


@settings(max_examples=300, deadline=None)
@given(ops=operations)
def test_no_grant_to_a_saturated_replica(ops) -> None:
    def check(scheduler: ReferenceScheduler, grants, before) -> None:
        by_replica: dict[str, list] = {}
        for grant in grants:
            by_replica.setdefault(grant.replica_id, []).append(grant)
        for replica_id, granted in by_replica.items():
            replica = scheduler.replicas[replica_id]
            if replica.fresh:
                limit = max(LIMITS[g.band].max_unstarted_steps for g in granted) * replica.step_tokens
                largest = max(scheduler.tickets[g.ticket_id].spec.prefill_tokens for g in granted)
                assert pending(replica) < limit + largest, (replica, granted)
                assert all(replica.signals.kv_usage < LIMITS[g.band].kv_ceiling for g in granted), (replica, granted)
            assert replica.slots_free >= 0

    _run(ops, check)


@settings(max_examples=300, deadline=None)
@given(ops=operations)
def test_work_conserving_no_open_replica_idles_while_a_ticket_it_can_run_waits(ops) -> None:
    def check(scheduler: ReferenceScheduler, grants, before) -> None:
        assert _placeable(scheduler) == []

    _run(ops, check)


@settings(max_examples=300, deadline=None)
@given(ops=operations)
def test_a_pools_reserve_stays_free_of_guarded_work_and_the_rest_is_work_conserving(ops) -> None:
    def check(scheduler: ReferenceScheduler, grants, before) -> None:
        latency = [r for r in scheduler.replicas.values() if r.pool == "latency"]
        assert sum(r.guarded_held == 0 for r in latency) >= 1  # its reserve: one holds no long prompt
        assert _placeable(scheduler) == []  # no other replica idles while a ticket it may run waits

    _run(ops, check, reserve=1, throughput=1)  # one throughput replica: long prompts often need the latency pool


@settings(max_examples=300, deadline=None)
@given(ops=operations)
def test_guarded_class_only_on_a_replica_holding_none_of_its_own_work(ops) -> None:
    def check(scheduler: ReferenceScheduler, grants, before) -> None:
        # grants come last in a call, each adding its work to its replica: what a grant met is (the state after
        # the call) minus what it and the later grants to its replica added (prompt tokens up to the chunk with
        # current signals, the reserve with stale ones; a grant of a class the replica does not guard is its
        # own work)
        def added(grant) -> int:
            ticket = scheduler.tickets[grant.ticket_id]
            return ticket.credit if scheduler.replicas[grant.replica_id].fresh else ticket.reserved_tokens

        for index, grant in enumerate(grants):
            replica = scheduler.replicas[grant.replica_id]
            if scheduler.tickets[grant.ticket_id].spec.length_class in replica.guarded:
                later = [g for g in grants[index:] if g.replica_id == grant.replica_id]
                own_later = sum(not scheduler.tickets[g.ticket_id].guarded for g in later)
                own_then = replica.slots_total - replica.slots_free - replica.guarded_held - own_later
                assert own_then == 0, grants
                assert pending(replica) - sum(added(g) for g in later) <= replica.step_tokens, grants

    _run(ops, check)


@settings(max_examples=300, deadline=None)
@given(ops=operations)
def test_guarded_held_counts_the_guarded_grants_a_replica_holds(ops) -> None:
    def check(scheduler: ReferenceScheduler, grants, before) -> None:
        for replica in scheduler.replicas.values():
            held = [t for t in scheduler.tickets.values() if t.granted_to == replica.replica_id]
            assert replica.guarded_held == sum(t.spec.length_class in replica.guarded for t in held)
            assert replica.slots_total - replica.slots_free == len(held)

    _run(ops, check)


def test_late_reports_do_not_overshoot() -> None:
    """A burst arrives between two reports: the in-flight credit stops it at the limit, not at the slots."""
    scheduler = ReferenceScheduler(BANDS, signal_stale_ms=STALE_MS)
    scheduler.register_replica(ReplicaCapacity("r", 64, 10**6, step_tokens=100), 0, LEASE)
    scheduler.report_signals("r", EngineSignals(), [], 0)
    granted = [g for i in range(40)
               for g in scheduler.enqueue(TicketSpec(f"t{i}", "a", "interactive", 10), 1, LEASE).grants]
    assert len(granted) == 30  # 3 steps of 100 tokens, 10 tokens each
    # the replica reports them received and one started: exactly one more goes
    received = [g.ticket_id for g in granted]
    more = scheduler.report_signals("r", EngineSignals(unstarted_tokens=10 * (len(received) - 1)), received, 2)
    assert len(more) == 1


def test_stale_signals_fall_back_to_the_concurrency_cap() -> None:
    scheduler = ReferenceScheduler(BANDS, signal_stale_ms=STALE_MS)
    scheduler.register_replica(ReplicaCapacity("r", 6, 10**6), 0, LEASE)
    scheduler.report_signals("r", EngineSignals(unstarted_tokens=10**5, kv_usage=0.99), [], 0)  # saturated
    assert scheduler.enqueue(TicketSpec("t0", "a", "interactive", 10), 10, LEASE).grants == []
    # no report for STALE_MS: dispatch continues, up to the replica's slots
    grants = scheduler.expire(STALE_MS)
    assert [g.ticket_id for g in grants] == ["t0"]
    granted = [g for i in range(1, 10) for g in scheduler.enqueue(TicketSpec(f"t{i}", "a", "batch", 10), 60, LEASE).grants]
    assert len(granted) == 5  # 6 slots
    assert not scheduler.replicas["r"].fresh


def test_lower_bands_close_first_and_the_top_band_keeps_headroom() -> None:
    scheduler = ReferenceScheduler(BANDS, signal_stale_ms=STALE_MS)
    scheduler.register_replica(ReplicaCapacity("r", 64, 10**6, step_tokens=100), 0, LEASE)
    scheduler.report_signals("r", EngineSignals(unstarted_tokens=200, kv_usage=0.8), [], 0)
    assert scheduler.enqueue(TicketSpec("b", "a", "batch", 10), 1, LEASE).grants == []  # kv 0.8 >= 0.7
    assert scheduler.enqueue(TicketSpec("s", "a", "standard", 10), 1, LEASE).grants == []  # 200 >= 2 steps
    assert [g.ticket_id for g in scheduler.enqueue(TicketSpec("i", "a", "interactive", 10), 1, LEASE).grants] == ["i"]


def test_a_latency_replica_prefills_long_prompts_only_while_it_holds_no_short_work() -> None:
    scheduler = ReferenceScheduler(BANDS, signal_stale_ms=STALE_MS)
    latency, throughput = _fleet()[0], _fleet()[2]
    for replica in (latency, throughput):
        scheduler.register_replica(replica, 0, LEASE)
    scheduler.report_signals(latency.replica_id, EngineSignals(), [], 0)
    scheduler.report_signals(throughput.replica_id, EngineSignals(unstarted_tokens=5000), [], 0)  # busy
    grants = [g for i in range(3) for g in scheduler.enqueue(TicketSpec(f"l{i}", "a", "batch", 500, 1.0, "long"),
                                                              1, LEASE).grants]
    # one step (400 tokens) of its own: l0 fills it (400 pending), l1 fits while that fits, l2 waits
    assert [(g.ticket_id, g.replica_id) for g in grants] == [("l0", "lat0"), ("l1", "lat0")]
    assert takes_guarded(scheduler.replicas["lat0"]) is False
    # a short one still goes to the latency replica, beside the long prefills, when no other can take it
    short = scheduler.enqueue(TicketSpec("s", "b", "interactive", 50), 1, LEASE).grants
    assert [(g.ticket_id, g.replica_id) for g in short] == [("s", "lat0")]
    # the long prefills end; while the short one runs there, no long one goes back
    scheduler.report_signals("lat0", EngineSignals(), ["l0", "l1", "s"], 2)
    scheduler.complete("l0", 500, 3)
    assert scheduler.complete("l1", 500, 3).grants == []
    assert scheduler.tickets["l2"].granted_to is None
    # once it holds no short work, it takes the waiting long prompt
    assert [(g.ticket_id, g.replica_id) for g in scheduler.complete("s", 60, 4).grants] == [("l2", "lat0")]


def test_short_requests_keep_away_from_a_replica_prefilling_long_prompts() -> None:
    scheduler = ReferenceScheduler(BANDS, signal_stale_ms=STALE_MS)
    first, second = _fleet()[:2]
    for replica in (first, second):
        scheduler.register_replica(replica, 0, LEASE)
        scheduler.report_signals(replica.replica_id, EngineSignals(), [], 0)

    def placed(ticket_id: str, band: str, cost: int, length_class: str, now: int) -> list[str]:
        spec = TicketSpec(ticket_id, "a", band, cost, 1.0, length_class)
        return [g.replica_id for g in scheduler.enqueue(spec, now, LEASE).grants]

    assert placed("l", "batch", 300, "long", 1) == ["lat0"]
    scheduler.report_signals("lat0", EngineSignals(unstarted_tokens=300), ["l"], 2)
    scheduler.report_signals("lat1", EngineSignals(unstarted_tokens=350), [], 2)  # more pending, no long prefill
    assert placed("s", "interactive", 50, "short", 3) == ["lat1"]
    # and lat1, now holding short work, takes no long prompt: the next one joins lat0 (300 pending fit a step)
    assert placed("l2", "batch", 300, "long", 4) == ["lat0"]


def test_with_a_reserve_of_one_the_second_latency_replica_stays_free_for_short_work() -> None:
    for reserve, second_long_on in ((0, "lat1"), (1, None)):
        scheduler = ReferenceScheduler(BANDS, signal_stale_ms=STALE_MS)
        for replica in _fleet(reserve)[:2]:
            scheduler.register_replica(replica, 0, LEASE)
            scheduler.report_signals(replica.replica_id, EngineSignals(), [], 0)
        first = scheduler.enqueue(TicketSpec("l0", "a", "batch", 500, 1.0, "long"), 1, LEASE).grants
        assert [g.replica_id for g in first] == ["lat0"]
        scheduler.report_signals("lat0", EngineSignals(unstarted_tokens=450), ["l0"], 2)  # over a step: full
        second = scheduler.enqueue(TicketSpec("l1", "a", "batch", 500, 1.0, "long"), 3, LEASE).grants
        assert [g.replica_id for g in second] == ([second_long_on] if second_long_on else [])
        if reserve:  # the short request finds the replica kept free; the long one waits for lat0
            short = scheduler.enqueue(TicketSpec("s", "b", "interactive", 50), 4, LEASE).grants
            assert [g.replica_id for g in short] == ["lat1"]
            scheduler.complete("l0", 500, 5)
            # lat1 serves short work, so lat0 is the pool's one empty replica, its reserve: l1 still waits
            assert scheduler.report_signals("lat0", EngineSignals(), [], 6) == []
            # the short request ends: two empty replicas, and one of them takes l1
            scheduler.report_signals("lat1", EngineSignals(), ["s"], 7)
            assert [(g.ticket_id, g.replica_id) for g in scheduler.complete("s", 60, 8).grants] == [("l1", "lat0")]


def test_a_pool_packs_its_short_work_while_a_replica_of_it_prefills_long_prompts() -> None:
    scheduler = ReferenceScheduler(BANDS, signal_stale_ms=STALE_MS)
    for i in range(3):
        replica = ReplicaCapacity(f"lat{i}", 8, 5_000, frozenset({"short", "long"}), "latency", frozenset({"short"}),
                                  frozenset({"long"}), step_tokens=400)
        scheduler.register_replica(replica, 0, LEASE)

    def placed(ticket_id: str, length_class: str, now: int) -> list[str]:
        grants = scheduler.enqueue(TicketSpec(ticket_id, "a", "interactive", 50, 1.0, length_class), now, LEASE).grants
        for grant in grants:  # the replica receives it and starts it at once: nothing of it is pending
            scheduler.report_signals(grant.replica_id, EngineSignals(), [grant.ticket_id], now)
        return [g.replica_id for g in grants]

    # nothing long in the pool: short work spreads, one request per replica
    assert [placed(f"s{i}", "short", 1) for i in range(3)] == [["lat0"], ["lat1"], ["lat2"]]
    scheduler.complete("s2", 60, 2)
    assert placed("l", "long", 3) == ["lat2"]  # the only replica holding no short work prefills it
    scheduler.complete("s1", 60, 4)
    # lat1 is empty again and lat0 holds one: while lat2 prefills a long prompt, short work packs onto lat0
    assert placed("s3", "short", 5) == ["lat0"]
    scheduler.complete("l", 500, 6)
    # no long prompt in the pool: short work spreads again, to the replica with the most free slots
    assert placed("s4", "short", 7) == ["lat1"]
