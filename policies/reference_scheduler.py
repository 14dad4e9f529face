"""The reference global scheduler: the exact decision procedure the Redis Lua scripts implement.

It is pure, in-memory Python with an explicit clock, used three ways: tests run the same random workload
through it and through the Lua scripts and compare every decision; the property tests check fairness,
strictness and capacity invariants on it; the discrete-event simulator runs on it.

Every mutating call: reap expired leases -> apply the call -> dispatch. Dispatch composes the policy
seams, each its own module mirrored by a Lua file of the same name:

* :mod:`policies.band_order` -- strict bands, highest first, with aging as the starvation guard;
* :mod:`policies.fairness` -- between tenants, then between a tenant's flows: token-weighted VTC;
* :mod:`policies.ordering` -- FIFO inside a flow, one line per length class (a ticket that cannot be
  placed holds back only its own class);
* :mod:`policies.gate` -- which replicas may take a band's grant now (engine signals, in-flight credit);
* :mod:`policies.placement` -- filter -> scorer -> picker among the open replicas.

A grant reserves a slot and ``min(cost, free tokens)`` tokens on the replica's registration (one that
lapsed or left and registered again starts afresh), returned exactly once by completion, requeue or lease
expiry, and counts as in flight there until the replica acknowledges it (in a signal report) or it ends.
Replicas report their engines' signals (:meth:`report_signals`); a report older than ``signal_stale_ms``
goes stale at the start of a call, and the gate falls back to the replica's concurrency cap. Flow counters live only while their tenant has waiting work in the
band, so a tenant's next busy period starts its flows level.
"""

from __future__ import annotations

from policies import fairness
from policies.band_order import aging_cutoff, bands_in_order, may_age_into
from policies.gate import is_stale, open_replicas
from policies.ordering import Fifo
from policies.placement import choose_replica, group_loads
from policies.scheduler_records import BandRecord, TenantFlows, TicketRecord
from policies.types import (
    BandPolicy, CancelResult, CompleteResult, EngineSignals, EnqueueResult, Grant, ReplicaCapacity, RequeueResult,
    TicketSpec,
)


class ReferenceScheduler:
    """In-memory model of the Redis global queue; same inputs give the same decisions as the Lua."""

    def __init__(self, bands: list[BandPolicy], max_grants_per_dispatch: int = 10**6, bulk_limit: int = 10**9,
                 signal_stale_ms: int = 2_000, max_flows: int = 64) -> None:
        if not bands:
            raise ValueError("at least one band is required")
        self.bands = list(bands)
        self._band_index = {band.name: index for index, band in enumerate(self.bands)}
        self._state = {band.name: BandRecord() for band in self.bands}
        self.tickets: dict[str, TicketRecord] = {}
        self.replicas: dict[str, ReplicaCapacity] = {}
        self.served: dict[str, int] = {}  # tokens charged per tenant at completion
        self.max_grants_per_dispatch = max_grants_per_dispatch
        # per call at most this many leases reaped, signals gone stale and tickets aged per band (the Lua's
        # bounds, to mirror it; unbounded by default, as one call that the Lua splits into several)
        self.bulk_limit = bulk_limit
        self.signal_stale_ms = signal_stale_ms
        self.max_flows = max_flows  # waiting flows per tenant and band
        self._positions = 0  # the flows' order: tail positions count up, head positions down
        self._epochs: dict[str, int] = {}  # replica -> its registration's number (a new one after a lapse)
        self._registrations = 0
        self._held_out: dict[str, int] = {}  # replica -> until when it may not register again

    # ----- calls (each: reap, apply, dispatch) -----

    def enqueue(self, spec: TicketSpec, now_ms: int, lease_ms: int) -> EnqueueResult:
        """Admit a ticket into its band (or reject it), then dispatch. Aged tickets move up before the new
        ticket enters: they arrived earlier."""
        self._reap(now_ms)
        self._promote_aged(now_ms)
        status = self._admit(spec, now_ms, lease_ms)
        return EnqueueResult(status, self._dispatch(now_ms, promoted=True))

    def register_replica(self, capacity: ReplicaCapacity, now_ms: int, lease_ms: int) -> list[Grant]:
        """Register a replica or renew its lease (a changed total adjusts what is free), then dispatch. A replica
        held out (:meth:`deregister_replica`) is not registered until its hold ends."""
        self._reap(now_ms)
        known = self.replicas.get(capacity.replica_id)
        self._held_out = {r: until for r, until in self._held_out.items() if until > now_ms}
        if known is None and capacity.replica_id in self._held_out:
            return self._dispatch(now_ms)
        if known is None:
            capacity.slots_free, capacity.tokens_free = capacity.slots_total, capacity.tokens_total
            capacity.in_flight = capacity.in_flight_tokens = capacity.guarded_held = 0
            self._registrations += 1
            self._epochs[capacity.replica_id] = self._registrations
            self.replicas[capacity.replica_id] = capacity
            known = capacity
        else:
            known.slots_free += capacity.slots_total - known.slots_total
            known.tokens_free += capacity.tokens_total - known.tokens_total
            known.slots_total, known.tokens_total = capacity.slots_total, capacity.tokens_total
            known.accepts, known.prefers, known.pool = capacity.accepts, capacity.prefers, capacity.pool
            known.guarded, known.step_tokens = capacity.guarded, capacity.step_tokens
            known.prefill_chunk, known.reserve = capacity.prefill_chunk, capacity.reserve
        known.expires_ms = now_ms + lease_ms
        return self._dispatch(now_ms)

    def report_signals(self, replica_id: str, signals: EngineSignals, received: list[str], now_ms: int,
                       progress: list[tuple[str, int]] = ()) -> list[Grant]:
        """A replica's engine report: its signals, the granted tickets it received since its last report
        (their in-flight credit ends), and ``progress``: (ticket, tokens served so far) for running requests
        past what they were charged, whose tenants are topped up to it. Then dispatch. An unknown replica's
        report changes nothing, and neither does a ticket it does not hold."""
        self._reap(now_ms)
        replica = self.replicas.get(replica_id)
        if replica is not None:
            for ticket_id in received:
                ticket = self.tickets.get(ticket_id)
                if ticket and ticket.granted_to == replica_id and self._same_registration(ticket) and not ticket.acked:
                    ticket.acked = True
                    replica.in_flight -= 1
                    replica.in_flight_tokens -= ticket.credit
            for ticket_id, served in progress:
                ticket = self.tickets.get(ticket_id)
                if ticket and ticket.granted_to == replica_id and self._same_registration(ticket):
                    extra = fairness.top_up(served, ticket.charged)
                    if extra:
                        self._charge(ticket.charged_band, ticket.spec.tenant, extra / ticket.spec.weight)
                        self._charge_flow(ticket.charged_band, ticket, extra)
                        ticket.topped += extra
            replica.signals, replica.signals_at_ms, replica.fresh = signals, now_ms, True
        return self._dispatch(now_ms)

    def deregister_replica(self, replica_id: str, now_ms: int, hold_ms: int = 0) -> list[Grant]:
        """Remove a replica (graceful shutdown; or unreachable, then held out ``hold_ms``: it does not register
        again before); its running grants release nothing later."""
        self._reap(now_ms)
        if hold_ms > 0:
            self._held_out[replica_id] = now_ms + hold_ms
        self.replicas.pop(replica_id, None)
        return self._dispatch(now_ms)

    def complete(self, ticket_id: str, actual_cost: int, now_ms: int) -> CompleteResult:
        """Finish a granted ticket: return its capacity, charge ``actual_cost``. False if not granted."""
        self._reap(now_ms)
        ticket = self.tickets.get(ticket_id)
        done = ticket is not None and ticket.granted_to is not None
        if done:
            assert ticket is not None
            self._release(ticket)
            correction = fairness.completion_correction(actual_cost, ticket.charged, ticket.spec.weight)
            self._charge(ticket.charged_band, ticket.spec.tenant, correction)
            self._charge_flow(ticket.charged_band, ticket, actual_cost - ticket.charged)
            self.served[ticket.spec.tenant] = self.served.get(ticket.spec.tenant, 0) + actual_cost
            del self.tickets[ticket_id]
        return CompleteResult(done, self._dispatch(now_ms))

    def cancel(self, ticket_id: str, now_ms: int) -> CancelResult:
        """Withdraw a waiting ticket: 'cancelled'; 'granted' (with where) if a grant won the race; else 'unknown'."""
        self._reap(now_ms)
        ticket = self.tickets.get(ticket_id)
        if ticket is not None and ticket.granted_to is not None:
            return CancelResult("granted", self._dispatch(now_ms), ticket.granted_to, ticket.granted_pool)
        status = "unknown"
        if ticket is not None:
            self._remove_waiting(ticket)
            del self.tickets[ticket_id]
            status = "cancelled"
        return CancelResult(status, self._dispatch(now_ms))

    def requeue(self, ticket_id: str, now_ms: int) -> RequeueResult:
        """Put a granted ticket back at the head of its tenant's queue (its replica was gone)."""
        self._reap(now_ms)
        ticket = self.tickets.get(ticket_id)
        moved = ticket is not None and ticket.granted_to is not None
        if moved:
            assert ticket is not None
            self._release(ticket)
            self._charge(ticket.charged_band, ticket.spec.tenant, -ticket.charged / ticket.spec.weight)
            self._charge_flow(ticket.charged_band, ticket, -ticket.charged)
            ticket.granted_to, ticket.topped = None, 0
            self._push(ticket, ticket.band, now_ms, at_head=True)
        return RequeueResult(moved, self._dispatch(now_ms))

    def renew(self, ticket_ids: list[str], now_ms: int, lease_ms: int) -> list[str]:
        """Extend the leases of these tickets (waiting or granted); returns the ids that no longer exist."""
        self._reap(now_ms)
        missing = []
        for ticket_id in ticket_ids:
            ticket = self.tickets.get(ticket_id)
            if ticket is None:
                missing.append(ticket_id)
            else:
                ticket.lease_expires_ms = now_ms + lease_ms
        return missing

    def expire(self, now_ms: int) -> list[Grant]:
        """Reap expired leases, then dispatch (what a periodic sweep does)."""
        self._reap(now_ms)
        return self._dispatch(now_ms)

    # ----- views -----

    def counter(self, band: str, tenant: str) -> float:
        """The tenant's virtual token counter in ``band`` (0 if never seen)."""
        return self._state[band].counters.get(tenant, 0.0)

    def queued(self, band: str) -> tuple[int, int]:
        """(tickets, tokens) waiting in ``band``."""
        state = self._state[band]
        return state.queued, state.queued_tokens

    def flow_counter(self, band: str, tenant: str, flow: str) -> float | None:
        """The flow's counter inside its tenant, None while the tenant has nothing waiting in ``band``."""
        flows = self._state[band].tenants.get(tenant)
        return None if flows is None else flows.counters.get(flow, 0.0)

    def waiting_ids(self, band: str, tenant: str) -> list[str]:
        """Ticket ids of a tenant waiting in a band (flow by flow, each in queue order)."""
        flows = self._state[band].tenants.get(tenant)
        return [] if flows is None else [t for flow in sorted(flows.queues) for t in flows.queues[flow]]

    def waiting_by_tenant(self, band: str) -> dict[str, tuple[int, int]]:
        """(tickets, tokens) waiting in ``band`` per tenant with waiting work."""
        result: dict[str, tuple[int, int]] = {}
        for tenant in self._state[band].tenants:
            ids = self.waiting_ids(band, tenant)
            result[tenant] = (len(ids), sum(self.tickets[t].spec.cost for t in ids))
        return result

    # ----- internals -----

    def _admit(self, spec: TicketSpec, now_ms: int, lease_ms: int) -> str:
        if spec.band not in self._state:
            return "unknown_band"
        if spec.ticket_id in self.tickets:
            return "duplicate"
        band = self.bands[self._band_index[spec.band]]
        state = self._state[spec.band]
        if state.queued >= band.max_queued:
            return "queue_full"
        if state.queued_tokens + spec.cost > band.max_queued_tokens:
            return "queue_tokens_full"
        mine = state.tenants.get(spec.tenant) or TenantFlows()
        if (mine.queued >= band.tenant_share * band.max_queued
                or mine.queued_tokens + spec.cost > band.tenant_share * band.max_queued_tokens):
            return "tenant_queue_full"
        ticket = TicketRecord(spec=spec, band=spec.band, entered_band_ms=now_ms, lease_expires_ms=now_ms + lease_ms)
        self.tickets[spec.ticket_id] = ticket
        self._push(ticket, spec.band, now_ms, at_head=False)
        return "admitted"

    def _push(self, ticket: TicketRecord, band: str, now_ms: int, at_head: bool) -> None:
        state = self._state[band]
        tenant = ticket.spec.tenant
        if tenant not in state.tenants:
            active = [state.counters[t] for t in state.tenants]
            state.counters[tenant] = fairness.lifted(state.counters.get(tenant, 0.0), active, state.virtual_time)
            state.tenants[tenant] = TenantFlows()
        flows = state.tenants[tenant]
        flow = ticket.flow = fairness.flow_of(ticket.spec.flow, flows.queues, self.max_flows)
        if flow not in flows.queues:
            active = [flows.counters[f] for f in flows.queues]
            flows.counters[flow] = fairness.lifted(flows.counters.get(flow, 0.0), active, 0.0)
            flows.queues[flow] = Fifo()
        self._positions += 1
        ticket.position = -self._positions if at_head else self._positions
        flows.queues[flow].add(ticket.spec.ticket_id, ticket.spec.length_class, ticket.position, at_head)
        flows.queued += 1
        flows.queued_tokens += ticket.spec.cost
        ticket.band, ticket.entered_band_ms, ticket.aging_stopped = band, now_ms, False
        state.queued += 1
        state.queued_tokens += ticket.spec.cost

    def _remove_waiting(self, ticket: TicketRecord) -> None:
        state = self._state[ticket.band]
        flows = state.tenants[ticket.spec.tenant]
        emptied = flows.queues[ticket.flow].remove(ticket.spec.ticket_id, ticket.spec.length_class)
        flows.queued -= 1
        flows.queued_tokens -= ticket.spec.cost
        state.queued -= 1
        state.queued_tokens -= ticket.spec.cost
        if emptied:
            del flows.queues[ticket.flow]
            del flows.counters[ticket.flow]  # an idle flow keeps no counter
            if not flows.queues:  # the tenant's last waiting ticket: its flow counters go too
                del state.tenants[ticket.spec.tenant]

    def _same_registration(self, ticket: TicketRecord) -> bool:
        return ticket.granted_to in self.replicas and self._epochs[ticket.granted_to] == ticket.granted_epoch

    def _release(self, ticket: TicketRecord) -> None:
        replica = self.replicas.get(ticket.granted_to or "")
        if replica is not None and self._same_registration(ticket):
            replica.slots_free = min(replica.slots_total, replica.slots_free + 1)
            replica.tokens_free = min(replica.tokens_total, replica.tokens_free + ticket.reserved_tokens)
            if not ticket.acked:  # it never arrived (or arrived unreported): its credit ends here
                replica.in_flight -= 1
                replica.in_flight_tokens -= ticket.credit
            if ticket.guarded:
                replica.guarded_held -= 1
        ticket.reserved_tokens = 0
        ticket.acked = ticket.guarded = False

    def _charge(self, band: str, tenant: str, amount: float) -> None:
        state = self._state[band]
        state.counters[tenant] = state.counters.get(tenant, 0.0) + amount

    def _charge_flow(self, band: str, ticket: TicketRecord, amount: float) -> None:
        flows = self._state[band].tenants.get(ticket.spec.tenant)
        if flows is not None and ticket.flow in flows.queues:  # an idle flow's counter was dropped: nothing to do
            flows.counters[ticket.flow] += amount

    def _reap(self, now_ms: int) -> None:
        dead = sorted((cap.expires_ms, r) for r, cap in self.replicas.items() if cap.expires_ms <= now_ms)
        for _, replica_id in dead[: self.bulk_limit]:
            del self.replicas[replica_id]
        stale = sorted((cap.signals_at_ms, r) for r, cap in self.replicas.items()
                       if is_stale(cap, now_ms, self.signal_stale_ms))
        for _, replica_id in stale[: self.bulk_limit]:
            self.replicas[replica_id].fresh = False
        expired = sorted(
            (t for t in self.tickets.values() if t.lease_expires_ms <= now_ms),
            key=lambda t: (t.lease_expires_ms, t.spec.ticket_id),
        )
        for ticket in expired[: self.bulk_limit]:
            if ticket.granted_to is None:
                self._remove_waiting(ticket)
            else:
                self._release(ticket)  # a dead gateway's grant: the estimate stays charged
            del self.tickets[ticket.spec.ticket_id]

    def _promote_aged(self, now_ms: int) -> None:
        for index in range(1, len(self.bands)):
            band = self.bands[index]
            cutoff = aging_cutoff(self.bands, index, now_ms)
            if cutoff is None:
                continue
            aged = sorted(
                (t for t in self.tickets.values() if t.granted_to is None and t.band == band.name
                 and t.entered_band_ms <= cutoff and not t.aging_stopped),
                key=lambda t: (t.entered_band_ms, t.spec.ticket_id),
            )
            for ticket in aged[: self.bulk_limit]:
                if may_age_into(self.bands, index - 1, ticket.spec.ceiling):
                    self._remove_waiting(ticket)
                    self._push(ticket, self.bands[index - 1].name, now_ms, at_head=False)
                else:
                    ticket.aging_stopped = True

    def _dispatch(self, now_ms: int, promoted: bool = False) -> list[Grant]:
        if not promoted:
            self._promote_aged(now_ms)
        grants: list[Grant] = []
        while len(grants) < self.max_grants_per_dispatch:
            grant = self._grant_one()
            if grant is None:
                break
            grants.append(grant)
        return grants

    def _grant_one(self) -> Grant | None:
        loads = None  # each group's spare replicas and whether it packs: counted once, when a band first needs it
        for band in bands_in_order(self.bands):
            state = self._state[band.name]
            if not state.tenants:
                continue
            candidates = open_replicas(self.replicas.values(), band)
            if not candidates:
                continue
            loads = loads if loads is not None else group_loads(self.replicas.values())
            for tenant in fairness.in_order(state.counters, state.tenants):
                flows = state.tenants[tenant]
                for flow in fairness.in_order(flows.counters, flows.queues):
                    for ticket_id in flows.queues[flow].heads():
                        ticket = self.tickets[ticket_id]
                        replica = choose_replica(candidates, ticket.spec.cost, ticket.spec.length_class, loads)
                        if replica is not None:
                            return self._grant(ticket, replica, state)
        return None

    def _grant(self, ticket: TicketRecord, replica: ReplicaCapacity, state: BandRecord) -> Grant:
        tenant = ticket.spec.tenant
        self._charge_flow(ticket.band, ticket, ticket.spec.cost)  # while the flow still waits
        self._remove_waiting(ticket)
        state.virtual_time = state.counters[tenant]
        state.counters[tenant] += fairness.grant_charge(ticket.spec.cost, ticket.spec.weight)
        reserved = min(ticket.spec.cost, replica.tokens_free)
        replica.slots_free -= 1
        replica.tokens_free -= reserved
        ticket.credit = replica.step_share(ticket.spec.prefill_tokens)
        replica.in_flight += 1
        replica.in_flight_tokens += ticket.credit
        ticket.guarded = ticket.spec.length_class in replica.guarded
        replica.guarded_held += ticket.guarded
        ticket.granted_to, ticket.reserved_tokens, ticket.charged_band = replica.replica_id, reserved, ticket.band
        ticket.granted_pool, ticket.granted_epoch = replica.pool, self._epochs[replica.replica_id]
        return Grant(ticket.spec.ticket_id, replica.replica_id, ticket.band, tenant, replica.pool)
