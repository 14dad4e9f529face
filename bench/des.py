"""Discrete-event simulation of a whole fleet: the planned workload through one system, on simulated
engines (replicas/sim_engine.py), with the project's own decision code.

The global queue is :class:`policies.reference_scheduler.ReferenceScheduler`, the exact procedure the
Redis Lua scripts implement (a test compares them decision by decision), so the simulated gateway orders,
places, gates and charges as the real one does; ``queue_overhead_s`` adds the measured Redis round trips to
each grant. Each simulated replica reports its engine's signals after its engine steps, at most once per
``signal_interval_s`` (the first change at once, the rest coalesced), naming the grants that reached it,
as the live replicas do; a report dispatches. An idle live replica repeats its last report by heartbeat, so
here signals never go stale. Power-of-two routing is Ray Serve's default router: two random replicas of the pool, the one with
fewer ongoing requests, at most ``max_ongoing_requests`` each (the rest wait at the caller, FIFO).

Not modelled: HTTP hops and the proxy (the live runs measure those), client think time, engine failures.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable

from bench.metrics import RequestRecord
from bench.systems import BAND_PRIORITY, PoolSpec, SystemSpec
from bench.workload import PlannedRequest
from policies.classification import LengthClasses
from policies.reference_scheduler import ReferenceScheduler
from policies.placement import guarded_classes
from policies.types import EngineSignals, ReplicaCapacity, TicketSpec
from replicas.sim_engine import SimEngine, SimRequest, StepCostModel, StepPlan

FOREVER_MS = 10 ** 15


class _Replica:
    def __init__(self, replica_id: str, pool: PoolSpec, cost: StepCostModel) -> None:
        self.replica_id = replica_id
        self.pool = pool
        self.engine = SimEngine(pool.engine, cost, pool.kv_tokens)
        self.stepping = False
        self.plan: StepPlan | None = None
        self.received: list[str] = []  # granted requests that reached it since its last report
        self.received_total = 0
        self.reported_s = float("-inf")
        self.report_due = False


class FleetSimulation:
    """One system, one workload, simulated time."""

    def __init__(self, system: SystemSpec, cost: StepCostModel, seed: int = 0) -> None:
        self.system = system
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._rng = random.Random(seed)
        self.replicas: dict[str, _Replica] = {}
        self.pools: dict[str, list[_Replica]] = {}
        for pool in system.pools:
            self.pools[pool.name] = [_Replica(f"{pool.name}-{i}", pool, cost) for i in range(pool.replicas)]
            self.replicas.update({r.replica_id: r for r in self.pools[pool.name]})
        self._waiting_at_router: dict[str, deque[tuple[PlannedRequest, RequestRecord]]] = {
            name: deque() for name in self.pools}
        self.records: dict[str, RequestRecord] = {}
        self._planned: dict[str, PlannedRequest] = {}
        self._where: dict[str, _Replica] = {}
        self.scheduler: ReferenceScheduler | None = None
        self._classes = LengthClasses.from_bounds([("short", system.short_prompt_tokens), ("long", None)])
        self._progress: Callable[[int], None] | None = None
        # engine seconds per pool and step mix: which length classes each step carried ("short", "long",
        # "long+short"): where a fleet's time goes, e.g. steps that carry only short work on a latency replica
        self.engine_seconds: dict[str, dict[str, float]] = {name: {} for name in self.pools}
        if system.routing == "global-queue":
            self._start_queue()

    # ----- the event loop -----

    def at(self, time_s: float, action: Callable[[], None]) -> None:
        """Schedule ``action`` at simulated time ``time_s``."""
        heapq.heappush(self._events, (time_s, next(self._order), action))

    def run(self, workload: list[PlannedRequest], progress: Callable[[int], None] | None = None) -> list[RequestRecord]:
        """Simulate until every request has ended; return one record per planned request."""
        for request in workload:
            self.records[request.request_id] = RequestRecord.planned(request)
            self._planned[request.request_id] = request
            self.at(request.send_s, lambda request=request: self._arrive(request))
        self._progress = progress
        while self._events:
            self.now, _, action = heapq.heappop(self._events)
            action()
        return [self.records[request.request_id] for request in workload]

    def _ended(self) -> None:
        if self._progress is not None:
            self._progress(1)

    # ----- arrivals and routing -----

    def _length_class(self, request: PlannedRequest) -> str:
        return self._classes.classify(request.prompt_tokens)

    def _arrive(self, request: PlannedRequest) -> None:
        record = self.records[request.request_id]
        if self.scheduler is not None:
            self._enqueue(request, record)
            return
        pool = self.system.pool_for(self._length_class(request))
        replica = self._power_of_two(self.pools[pool.name])
        if replica is None:
            self._waiting_at_router[pool.name].append((request, record))
        else:
            self._start(replica, request)

    def _power_of_two(self, replicas: list[_Replica]) -> _Replica | None:
        candidates = self._rng.sample(replicas, min(2, len(replicas)))
        candidates = [r for r in candidates if r.engine.unfinished < self.system.max_ongoing_requests]
        if not candidates:  # Serve then tries others before queueing at the caller
            candidates = [r for r in replicas if r.engine.unfinished < self.system.max_ongoing_requests]
        return min(candidates, key=lambda r: r.engine.unfinished, default=None)

    def _start(self, replica: _Replica, request: PlannedRequest) -> None:
        priority = BAND_PRIORITY.get(request.band, 1) if self.system.priorities else 0
        replica.engine.add(SimRequest(request.request_id, request.prompt_tokens, request.output_tokens,
                                      priority=priority, arrival_s=self.now))
        self.records[request.request_id].dispatched_s = self.now
        self.records[request.request_id].pool = replica.pool.name
        replica.received.append(request.request_id)
        replica.received_total += 1
        self._where[request.request_id] = replica
        if not replica.stepping:
            self._step(replica)

    # ----- engines -----

    def _step(self, replica: _Replica) -> None:
        plan = replica.engine.plan_step()
        if not plan.work:
            replica.stepping = False
            return
        replica.stepping = True
        replica.plan = plan
        mix = "+".join(sorted({self._classes.classify(request.prompt_tokens) for request, _ in plan.work}))
        spent = self.engine_seconds[replica.pool.name]
        spent[mix] = spent.get(mix, 0.0) + plan.duration_s
        for request in plan.admitted:
            self.records[request.request_id].engine_start_s = self.now
        self.at(self.now + plan.duration_s, lambda: self._step_done(replica))

    def _step_done(self, replica: _Replica) -> None:
        outcome = replica.engine.finish_step(replica.plan)
        for request in outcome.emitted:
            record = self.records[request.request_id]
            if record.first_token_s is None:
                record.first_token_s = self.now
            record.token_s.append(self.now)
        for request in outcome.finished:
            record = self.records[request.request_id]
            record.status, record.end_s = 200, self.now
            self._ended()
            self._finished(replica, request)
        self._step(replica)
        if self.scheduler is not None:
            self._signal(replica)

    # ----- engine signals -----

    def _signal(self, replica: _Replica) -> None:
        """The engine stepped: report now, or once the interval since the last report has passed."""
        if replica.report_due:
            return
        wait = replica.reported_s + self.system.signal_interval_s - self.now
        if wait <= 0:
            self._report(replica)
        else:
            replica.report_due = True
            self.at(self.now + wait, lambda: self._report(replica))

    def _report(self, replica: _Replica) -> None:
        engine = replica.engine
        signals = EngineSignals(unstarted=engine.unstarted, unstarted_tokens=engine.unstarted_tokens,
                                running=len(engine.running), waiting=engine.waiting, kv_usage=engine.kv_usage,
                                received=replica.received_total)
        received, replica.received = replica.received, []
        replica.reported_s, replica.report_due = self.now, False
        self._deliver(self.scheduler.report_signals(replica.replica_id, signals, received, self._ms()))

    def _finished(self, replica: _Replica, request: SimRequest) -> None:
        del self._where[request.request_id]
        if self.scheduler is not None:
            _, grants = self.scheduler.complete(request.request_id, request.prompt_tokens + request.generated,
                                                self._ms())
            self._deliver(grants)
            return
        waiting = self._waiting_at_router[replica.pool.name]
        if waiting and replica.engine.unfinished < self.system.max_ongoing_requests:
            queued, _ = waiting.popleft()
            self._start(replica, queued)

    # ----- the global queue -----

    def _ms(self) -> int:
        return int(self.now * 1000)

    def _start_queue(self) -> None:
        self.scheduler = ReferenceScheduler(self.system.band_policies(), signal_stale_ms=FOREVER_MS)
        order = ["short", "long"]
        for replica in self.replicas.values():
            pool = replica.pool
            capacity = ReplicaCapacity(replica_id=replica.replica_id,
                                       slots_total=pool.queue_slots or pool.engine.max_num_seqs,
                                       tokens_total=pool.kv_tokens, accepts=frozenset(pool.accepts),
                                       prefers=frozenset(pool.prefers), pool=pool.name,
                                       guarded=guarded_classes(pool.accepts, pool.prefers, order),
                                       step_tokens=pool.engine.max_num_batched_tokens,
                                       prefill_chunk=pool.engine.long_prefill_token_threshold,
                                       reserve=pool.reserve)
            self.scheduler.register_replica(capacity, 0, FOREVER_MS)
            self._report(replica)

    def _enqueue(self, request: PlannedRequest, record: RequestRecord) -> None:
        spec = TicketSpec(ticket_id=request.request_id, tenant=request.tenant, band=request.band,
                          cost=request.prompt_tokens + request.output_tokens, weight=request.weight,
                          length_class=self._length_class(request), prompt_tokens=request.prompt_tokens)
        result = self.scheduler.enqueue(spec, self._ms(), FOREVER_MS)
        if not result.admitted:
            record.status, record.end_s, record.error = 429, self.now, result.status
            self._ended()
        else:
            self.at(self.now + self.system.max_wait_s, lambda: self._give_up(request.request_id))
        self._deliver(result.grants)

    def _give_up(self, ticket_id: str) -> None:
        status, grants, *_ = self.scheduler.cancel(ticket_id, self._ms())
        if status == "cancelled":
            record = self.records[ticket_id]
            record.status, record.end_s, record.error = 429, self.now, "queue_timeout"
            self._ended()
        self._deliver(grants)

    def _deliver(self, grants) -> None:
        for grant in grants:
            replica = self.replicas[grant.replica_id]
            request = self._planned[grant.ticket_id]
            self.at(self.now + self.system.queue_overhead_s, lambda r=replica, q=request: self._start(r, q))


def simulate(system: SystemSpec, cost: StepCostModel, workload: list[PlannedRequest], seed: int = 0,
             progress: Callable[[int], None] | None = None) -> list[RequestRecord]:
    """Run ``workload`` through ``system`` on simulated engines; one record per request."""
    return FleetSimulation(system, cost, seed).run(workload, progress)


def engine_time(simulation: FleetSimulation) -> dict[str, dict[str, float]]:
    """Per pool: its replicas, and the engine seconds per replica spent on steps of each mix of length classes
    (``short``, ``long``, ``long+short``), after a run."""
    return {pool: {"replicas": len(simulation.pools[pool]),
                   **{mix: round(seconds / len(simulation.pools[pool]), 3) for mix, seconds in sorted(spent.items())}}
            for pool, spent in simulation.engine_seconds.items()}
