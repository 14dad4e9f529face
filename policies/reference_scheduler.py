"""The reference global scheduler: the exact decision procedure the Redis Lua scripts implement.

It is pure, in-memory Python with an explicit clock, used three ways: tests run the same random workload
through it and through the Lua scripts and compare every decision; the property tests check fairness,
strictness and capacity invariants on it; the discrete-event simulator runs on it.

Decision procedure (every mutating call: reap expired leases -> apply the call -> dispatch):

* **Bands are strict.** Dispatch scans bands from the highest; a lower band gets a grant only when no
  ticket of a higher band fits any replica (work-conserving strict priority).
* **Inside a band, token-weighted fairness (VTC).** Each tenant has a virtual token counter per band. The
  active tenant with the smallest counter (ties: smallest tenant id) goes first; a grant charges
  ``cost / weight`` at once, and completion corrects it to ``actual / weight``. A tenant that becomes active
  is lifted to the smallest active counter (or the band's virtual time when none is active), so idle time
  banks no credit. Hence counters of active tenants stay within one weighted request cost of each other,
  and two continuously backlogged tenants' weighted service differs by at most 2x the largest weighted cost.
* **Flows inside a tenant.** A tenant's tickets are split into flows (the fairness id a client may send;
  one default flow otherwise). Inside the tenant, the waiting flow with the least service (a second,
  unweighted counter per flow, lifted on activation like the tenant's) goes first; FIFO inside a flow.
  Flow counters live only while the tenant has waiting work in the band: when its last waiting ticket
  leaves, they are dropped, so a tenant's next busy period starts its flows level. Flows therefore share
  their tenant's share without changing what the tenant gets against other tenants.
* **Aging.** A ticket that has waited ``aging_ms`` in its band is moved to the tail of its tenant's queue in
  the band above, so no ticket starves behind a higher band forever.
* **Placement** per :func:`policies.placement.choose_replica`; a grant reserves a slot and ``min(cost,
  free tokens)`` tokens on the replica, returned exactly once by completion, requeue or lease expiry.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from policies.placement import choose_replica
from policies.types import BandPolicy, Grant, ReplicaCapacity, TicketSpec


@dataclass
class _Ticket:
    spec: TicketSpec
    band: str
    entered_band_ms: int
    lease_expires_ms: int
    granted_to: str | None = None
    reserved_tokens: int = 0
    charged_band: str = ""


@dataclass(frozen=True)
class Admission:
    """Outcome of an enqueue: admitted, or rejected with a reason."""

    admitted: bool
    reason: str = ""


@dataclass
class _TenantFlows:
    queues: dict[str, deque[str]] = field(default_factory=dict)  # waiting flows -> ticket ids, FIFO
    counters: dict[str, float] = field(default_factory=dict)  # flow -> service inside the tenant


@dataclass
class _BandState:
    tenants: dict[str, _TenantFlows] = field(default_factory=dict)  # the active (waiting) tenants
    counters: dict[str, float] = field(default_factory=dict)
    virtual_time: float = 0.0
    queued: int = 0
    queued_tokens: int = 0


class ReferenceScheduler:
    """In-memory model of the Redis global queue; same inputs give the same decisions as the Lua."""

    def __init__(self, bands: list[BandPolicy], max_grants_per_dispatch: int = 1000) -> None:
        if not bands:
            raise ValueError("at least one band is required")
        self.bands = list(bands)
        self._band_index = {band.name: index for index, band in enumerate(self.bands)}
        self._state = {band.name: _BandState() for band in self.bands}
        self.tickets: dict[str, _Ticket] = {}
        self.replicas: dict[str, ReplicaCapacity] = {}
        self.served: dict[str, int] = {}  # tokens charged per tenant at completion
        self.max_grants_per_dispatch = max_grants_per_dispatch

    # ----- calls (each: reap, apply, dispatch) -----

    def enqueue(self, spec: TicketSpec, now_ms: int, lease_ms: int) -> tuple[Admission, list[Grant]]:
        """Admit a ticket into its band (or reject it), then dispatch."""
        self._reap(now_ms)
        admission = self._admit(spec, now_ms, lease_ms)
        return admission, self._dispatch(now_ms)

    def register_replica(self, capacity: ReplicaCapacity, now_ms: int, lease_ms: int) -> list[Grant]:
        """Register a replica or renew its lease (a changed total adjusts what is free), then dispatch."""
        self._reap(now_ms)
        known = self.replicas.get(capacity.replica_id)
        if known is None:
            capacity.slots_free, capacity.tokens_free = capacity.slots_total, capacity.tokens_total
            self.replicas[capacity.replica_id] = capacity
            known = capacity
        else:
            known.slots_free += capacity.slots_total - known.slots_total
            known.tokens_free += capacity.tokens_total - known.tokens_total
            known.slots_total, known.tokens_total = capacity.slots_total, capacity.tokens_total
            known.accepts, known.prefers, known.pool = capacity.accepts, capacity.prefers, capacity.pool
        known.expires_ms = now_ms + lease_ms
        return self._dispatch(now_ms)

    def deregister_replica(self, replica_id: str, now_ms: int) -> list[Grant]:
        """Remove a replica (graceful shutdown); its running grants release nothing later."""
        self._reap(now_ms)
        self.replicas.pop(replica_id, None)
        return self._dispatch(now_ms)

    def complete(self, ticket_id: str, actual_cost: int, now_ms: int) -> tuple[bool, list[Grant]]:
        """Finish a granted ticket: return its capacity, charge ``actual_cost``. False if not granted."""
        self._reap(now_ms)
        ticket = self.tickets.get(ticket_id)
        done = ticket is not None and ticket.granted_to is not None
        if done:
            assert ticket is not None
            self._release(ticket)
            correction = actual_cost - ticket.spec.cost
            self._charge(ticket.charged_band, ticket.spec.tenant, correction / ticket.spec.weight)
            self._charge_flow(ticket.charged_band, ticket.spec, correction)
            self.served[ticket.spec.tenant] = self.served.get(ticket.spec.tenant, 0) + actual_cost
            del self.tickets[ticket_id]
        return done, self._dispatch(now_ms)

    def cancel(self, ticket_id: str, now_ms: int) -> tuple[str, list[Grant]]:
        """Withdraw a waiting ticket: 'cancelled'; 'granted' if a grant won the race; else 'unknown'."""
        self._reap(now_ms)
        ticket = self.tickets.get(ticket_id)
        if ticket is None:
            status = "unknown"
        elif ticket.granted_to is not None:
            status = "granted"
        else:
            self._remove_waiting(ticket)
            del self.tickets[ticket_id]
            status = "cancelled"
        return status, self._dispatch(now_ms)

    def requeue(self, ticket_id: str, now_ms: int) -> tuple[bool, list[Grant]]:
        """Put a granted ticket back at the head of its tenant's queue (its replica was gone)."""
        self._reap(now_ms)
        ticket = self.tickets.get(ticket_id)
        moved = ticket is not None and ticket.granted_to is not None
        if moved:
            assert ticket is not None
            self._release(ticket)
            self._charge(ticket.charged_band, ticket.spec.tenant, -ticket.spec.cost / ticket.spec.weight)
            self._charge_flow(ticket.charged_band, ticket.spec, -ticket.spec.cost)
            ticket.granted_to = None
            self._push(ticket, ticket.band, now_ms, at_head=True)
        return moved, self._dispatch(now_ms)

    def renew(self, ticket_ids: list[str], now_ms: int, lease_ms: int) -> int:
        """Extend the leases of these tickets (waiting or granted); returns how many still exist."""
        self._reap(now_ms)
        alive = 0
        for ticket_id in ticket_ids:
            ticket = self.tickets.get(ticket_id)
            if ticket is not None:
                ticket.lease_expires_ms = now_ms + lease_ms
                alive += 1
        return alive

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

    def _admit(self, spec: TicketSpec, now_ms: int, lease_ms: int) -> Admission:
        if spec.band not in self._state:
            return Admission(False, "unknown_band")
        if spec.ticket_id in self.tickets:
            return Admission(False, "duplicate")
        band = self.bands[self._band_index[spec.band]]
        state = self._state[spec.band]
        if state.queued >= band.max_queued:
            return Admission(False, "queue_full")
        if state.queued_tokens + spec.cost > band.max_queued_tokens:
            return Admission(False, "queue_tokens_full")
        ticket = _Ticket(spec=spec, band=spec.band, entered_band_ms=now_ms, lease_expires_ms=now_ms + lease_ms)
        self.tickets[spec.ticket_id] = ticket
        self._push(ticket, spec.band, now_ms, at_head=False)
        return Admission(True)

    def _push(self, ticket: _Ticket, band: str, now_ms: int, at_head: bool) -> None:
        state = self._state[band]
        tenant, flow = ticket.spec.tenant, ticket.spec.flow
        if tenant not in state.tenants:
            floor = min(state.counters[t] for t in state.tenants) if state.tenants else state.virtual_time
            state.counters[tenant] = max(state.counters.get(tenant, 0.0), floor)
            state.tenants[tenant] = _TenantFlows()
        flows = state.tenants[tenant]
        if flow not in flows.queues:
            floor = min(flows.counters[f] for f in flows.queues) if flows.queues else 0.0
            flows.counters[flow] = max(flows.counters.get(flow, 0.0), floor)
            flows.queues[flow] = deque()
        queue = flows.queues[flow]
        if at_head:
            queue.appendleft(ticket.spec.ticket_id)
        else:
            queue.append(ticket.spec.ticket_id)
        ticket.band, ticket.entered_band_ms = band, now_ms
        state.queued += 1
        state.queued_tokens += ticket.spec.cost

    def _remove_waiting(self, ticket: _Ticket) -> None:
        state = self._state[ticket.band]
        flows = state.tenants[ticket.spec.tenant]
        queue = flows.queues[ticket.spec.flow]
        queue.remove(ticket.spec.ticket_id)
        state.queued -= 1
        state.queued_tokens -= ticket.spec.cost
        if not queue:
            del flows.queues[ticket.spec.flow]
            if not flows.queues:  # the tenant's last waiting ticket: its flow counters go too
                del state.tenants[ticket.spec.tenant]

    def _release(self, ticket: _Ticket) -> None:
        replica = self.replicas.get(ticket.granted_to or "")
        if replica is not None:
            replica.slots_free = min(replica.slots_total, replica.slots_free + 1)
            replica.tokens_free = min(replica.tokens_total, replica.tokens_free + ticket.reserved_tokens)
        ticket.reserved_tokens = 0

    def _charge(self, band: str, tenant: str, amount: float) -> None:
        state = self._state[band]
        state.counters[tenant] = state.counters.get(tenant, 0.0) + amount

    def _charge_flow(self, band: str, spec: TicketSpec, amount: float) -> None:
        flows = self._state[band].tenants.get(spec.tenant)
        if flows is not None:  # an idle tenant's flow counters were dropped; nothing to correct
            flows.counters[spec.flow] = flows.counters.get(spec.flow, 0.0) + amount

    def _reap(self, now_ms: int) -> None:
        for replica_id in [r for r, cap in self.replicas.items() if cap.expires_ms <= now_ms]:
            del self.replicas[replica_id]
        expired = sorted(
            (t for t in self.tickets.values() if t.lease_expires_ms <= now_ms),
            key=lambda t: (t.lease_expires_ms, t.spec.ticket_id),
        )
        for ticket in expired:
            if ticket.granted_to is None:
                self._remove_waiting(ticket)
            else:
                self._release(ticket)  # a dead gateway's grant: the estimate stays charged
            del self.tickets[ticket.spec.ticket_id]

    def _promote_aged(self, now_ms: int) -> None:
        for index in range(1, len(self.bands)):
            band = self.bands[index]
            if band.aging_ms <= 0:
                continue
            cutoff = now_ms - band.aging_ms
            aged = sorted(
                (t for t in self.tickets.values()
                 if t.granted_to is None and t.band == band.name and t.entered_band_ms <= cutoff),
                key=lambda t: (t.entered_band_ms, t.spec.ticket_id),
            )
            for ticket in aged:
                self._remove_waiting(ticket)
                self._push(ticket, self.bands[index - 1].name, now_ms, at_head=False)

    def _dispatch(self, now_ms: int) -> list[Grant]:
        self._promote_aged(now_ms)
        grants: list[Grant] = []
        while len(grants) < self.max_grants_per_dispatch:
            grant = self._grant_one()
            if grant is None:
                break
            grants.append(grant)
        return grants

    def _grant_one(self) -> Grant | None:
        if not any(replica.slots_free > 0 for replica in self.replicas.values()):
            return None
        for band in self.bands:
            state = self._state[band.name]
            for tenant in sorted(state.tenants, key=lambda t: (state.counters[t], t)):
                flows = state.tenants[tenant]
                flow = min(flows.queues, key=lambda f: (flows.counters[f], f))
                ticket = self.tickets[flows.queues[flow][0]]
                replica = choose_replica(self.replicas.values(), ticket.spec.cost, ticket.spec.length_class)
                if replica is not None:
                    return self._grant(ticket, replica, state)
        return None

    def _grant(self, ticket: _Ticket, replica: ReplicaCapacity, state: _BandState) -> Grant:
        tenant = ticket.spec.tenant
        self._charge_flow(ticket.band, ticket.spec, ticket.spec.cost)  # while the flow still waits
        self._remove_waiting(ticket)
        state.virtual_time = state.counters[tenant]
        state.counters[tenant] += ticket.spec.cost / ticket.spec.weight
        reserved = min(ticket.spec.cost, replica.tokens_free)
        replica.slots_free -= 1
        replica.tokens_free -= reserved
        ticket.granted_to, ticket.reserved_tokens, ticket.charged_band = replica.replica_id, reserved, ticket.band
        return Grant(ticket.spec.ticket_id, replica.replica_id, ticket.band, tenant, replica.pool)
