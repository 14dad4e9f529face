"""Admission: how a classified request gets its place on a replica. Two strategies with one face.

* :class:`QueueAdmission` goes through the global queue: the tenant's rate limits, a ticket, the wait for
  its grant (which names the replica), and back to the queue's head when that replica is gone.
* :class:`DirectAdmission` is the baseline without the queue: the length class's pool, Ray Serve's
  default router inside it.

Each returns an :class:`Admitted`: where to forward, and how to give back what it holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import redis

from fleet.config import QueueConfig
from fleet.connection import global_queue, redis_client
from fleet.outage_log import OutageLog
from fleet.session import AdmitTiming, QueueDeadlineExpired, QueueRateLimited, QueueRejected, QueueSession, QueueTicketLost
from gateway.classify import Classification
from gateway.errors import (
    GatewayError,
    QueueFull,
    QueueTimeout,
    QueueUnavailable,
    RateLimited,
    Rejected,
    UpstreamUnavailable,
)
from gateway.headers import RequestHeaders
from gateway.leaving_replicas import LeavingReplicas
from gateway.metrics import GatewayMetrics
from gateway.rate_holds import RateHolds
from gateway.request_parsing import ParsedRequest
from gateway.routed_replicas import is_routable, was_routed
from gateway.tenants import Tenant
from policies.placement import pool_for_class
from policies.priority import BandDecision
from policies.types import Grant, TicketSpec

logger = logging.getLogger(__name__)

MAX_REQUEUES = 3


@dataclass(frozen=True)
class AdmissionRequest:
    """A classified request asking for a place."""

    parsed: ParsedRequest
    tenant: Tenant
    decision: BandDecision
    asked: RequestHeaders
    size: Classification
    arrived: float


class Admitted(Protocol):
    """An admitted request's place: the pool (and, with the queue, the replica) to forward to."""

    pool: str
    replica_id: str | None
    ticket_id: str | None  # the grant the replica acknowledges (None without the queue)
    prompt_tokens: int  # what the request weighs at its replica until the engine starts it
    charged: int  # the tokens its tenant was charged at the grant (its estimate; 0: nothing charged)
    queue_ms: float | None
    stages: dict[str, float]  # admission's stages (enqueue, wait_grant), in seconds

    async def requeue(self) -> None:
        """The named replica is gone: wait for another place, or raise the client-facing error."""

    async def release(self, served_tokens: int) -> None:
        """Give back what the place holds and charge ``served_tokens``; called exactly once."""


class AdmissionStrategy(Protocol):
    """Turns admission requests into places (one per gateway replica)."""

    gateway_id: str

    async def start(self) -> None:
        """Connect (on the serving event loop)."""

    async def admit(self, request: AdmissionRequest) -> Admitted:
        """A place for ``request``, or the client-facing error (429, 503)."""

    def check_held(self, tenant_id: str) -> None:
        """Raise the 429 at once while the queue holds ``tenant_id`` back (before its body is read)."""


@dataclass
class DirectPlace:
    """A place without the queue: the pool; Serve's router picks the replica."""

    pool: str
    replica_id: str | None = None
    ticket_id: str | None = None
    prompt_tokens: int = 0
    charged: int = 0
    queue_ms: float | None = None
    stages: dict[str, float] = field(default_factory=dict)

    async def requeue(self) -> None:
        """Without grants nothing is misrouted; a replica answering so is a failure."""
        raise UpstreamUnavailable("The request reached the wrong replica.")

    async def release(self, served_tokens: int) -> None:
        """Nothing is held."""


class DirectAdmission:
    """No global queue (the baseline): every request goes to its length class's pool at once."""

    gateway_id = ""

    def __init__(self, pool_for_class: dict[str, str]) -> None:
        self._pool_for_class = pool_for_class

    async def start(self) -> None:
        """Nothing to connect."""

    async def admit(self, request: AdmissionRequest) -> Admitted:
        """The class's pool."""
        return DirectPlace(self._pool_for_class[request.size.length_class])

    def check_held(self, tenant_id: str) -> None:
        """No queue, no rate limits."""


class QueueAdmission:
    """Admission through the global queue: rate limits, a ticket, its grant."""

    def __init__(self, config: QueueConfig, metrics: GatewayMetrics, clock: Callable[[], float] = time.monotonic,
                 longest_drain_s: float = 0.0) -> None:
        """``longest_drain_s``: the longest a pool's replica drains when Serve stops it (its pool's
        ``graceful_shutdown_timeout_s``), so how long a departing replica may need holding out."""
        self.config = config
        self.metrics = metrics
        self._clock = clock
        self._session: QueueSession | None = None
        self._holds = RateHolds(clock)
        self.outage = OutageLog(logger, "the global queue", clock=clock)  # one line per outage, not per request
        self.gateway_id = ""
        self.leaving = LeavingReplicas(self._hold_out, is_routable, config.unreachable_hold_s, longest_drain_s)

    async def _hold_out(self, replica_id: str, hold_ms: int) -> None:
        await (await self.session()).queue.deregister_replica(replica_id, hold_ms=hold_ms)

    def check_held(self, tenant_id: str) -> None:
        """Raise the 429 at once while the queue holds ``tenant_id`` back (gateway/rate_holds.py)."""
        self._holds.check(tenant_id)

    async def start(self) -> None:
        """Open the replica's queue session on the serving event loop (idempotent)."""
        await self.session()

    async def session(self) -> QueueSession:
        """The replica's queue session, created on first use."""
        if self._session is None:
            queue = global_queue(self.config, redis_client(self.config))
            self._session = QueueSession(queue, redis_client(self.config, max_connections=2))
            self.gateway_id = self._session.owner
            await self._session.start()
        return self._session

    async def admit(self, request: AdmissionRequest) -> Admitted:
        """Enqueue a ticket (the tenant's rate limits taken in the same step) and wait for its grant."""
        session = await self.session()
        spec = TicketSpec(
            ticket_id=session.new_ticket_id(), tenant=request.tenant.id, band=request.decision.band,
            cost=request.size.cost, weight=request.tenant.weight, length_class=request.size.length_class,
            owner=session.owner, flow=request.asked.flow, prompt_tokens=request.size.prompt_tokens,
            ceiling=request.tenant.max_band or "",
        )
        max_wait_s = min(self.config.max_wait_s, request.asked.ttft_slo_s or self.config.max_wait_s)
        started = self._clock()
        timing = AdmitTiming(self._clock)
        try:
            grant = await self.await_grant(session.admit(spec, max_wait_s, request.tenant.rate_limits, timing),
                                           spec.tenant)
        except Rejected as exc:
            self.metrics.rejections.labels(self.metrics.tenant(spec.tenant), spec.band, exc.reason).inc()
            raise
        granted = self._clock()
        queue_s = granted - started  # in the global queue: enqueue to grant (parsing and counting not included)
        self.metrics.grants.labels(self.metrics.tenant(spec.tenant), grant.band, spec.length_class, grant.pool).inc()
        self.metrics.queue_wait.labels(spec.band).observe(queue_s)
        enqueued = timing.enqueued_at or granted
        stages = {"enqueue": enqueued - started, "wait_grant": granted - enqueued}
        return QueuePlace(self, session, spec, max_wait_s, grant, queue_s * 1000, stages)

    async def await_grant(self, waiting: Awaitable[Grant], tenant: str | None = None) -> Grant:
        """Await a grant; admission failures become the client-facing 429 / 503 errors. A rate limit that holds
        back every request of ``tenant`` for a while is remembered, to refuse its next ones before parsing."""
        try:
            grant = await waiting
        except redis.RedisError as exc:
            self.outage.failed(exc)
            raise admission_error(exc, self.config.retry_after_s) from None
        except (QueueRateLimited, QueueRejected, QueueDeadlineExpired, QueueTicketLost) as exc:
            self.outage.succeeded()  # the queue answered
            if isinstance(exc, QueueRateLimited) and tenant is not None:
                self._holds.hold(tenant, exc.held_s)
            raise admission_error(exc, self.config.retry_after_s) from None
        self.outage.succeeded()
        return grant


class QueuePlace:
    """A granted ticket: its replica, and the way back (requeue, or release at the end)."""

    def __init__(self, admission: QueueAdmission, session: QueueSession, spec: TicketSpec, max_wait_s: float,
                 grant: Grant, queue_ms: float, stages: dict[str, float]) -> None:
        self._admission, self._session, self._spec = admission, session, spec
        self._max_wait_s = max_wait_s
        self._requeues = 0
        self.ticket_id, self.prompt_tokens, self.charged = spec.ticket_id, spec.prefill_tokens, spec.cost
        self.queue_ms = queue_ms
        self.stages = stages
        self._take(grant)

    def _take(self, grant: Grant) -> None:
        self.pool, self.replica_id = grant.pool, grant.replica_id

    async def requeue(self) -> None:
        """The granted replica is gone (another answered for it): take it out of the fleet, then back to the
        head of the tenant's queue to wait for the next grant. A replica this gateway's routers delivered to
        before is leaving (Serve is draining it): held out for ``unreachable_hold_s``, so its heartbeat does
        not bring it back meanwhile. One they never delivered to is new (registered before Serve published
        it to this router): no hold, its next heartbeat brings it back."""
        self._requeues += 1
        if self._requeues > MAX_REQUEUES:
            raise UpstreamUnavailable("The granted replicas kept disappearing; retry shortly.")
        if self.replica_id is not None:
            try:
                hold_s = self._admission.config.unreachable_hold_s if was_routed(self.replica_id) else 0
                await self._session.queue.deregister_replica(self.replica_id, hold_ms=int(hold_s * 1000))
                if hold_s:
                    self._admission.leaving.watch(self.replica_id)  # held out for as long as it drains
            except redis.RedisError:  # its lease lapses instead
                logger.warning("could not deregister a replica that is gone")
        self._take(await self._admission.await_grant(self._session.wait_again(self._spec, self._max_wait_s)))

    async def release(self, served_tokens: int) -> None:
        """Return the capacity and charge ``served_tokens`` (the ledger, the rate bucket); survives cancellation."""
        try:
            await asyncio.shield(self._session.finish(self._spec.ticket_id, served_tokens))
        except redis.RedisError as exc:  # the lease expires instead and returns the capacity
            self._admission.outage.failed(exc)
        else:
            self._admission.outage.succeeded()


def admission_for(config: QueueConfig, pools: list[tuple[str, list[str], list[str]]],
                  metrics: GatewayMetrics, longest_drain_s: float = 0.0) -> AdmissionStrategy:
    """The global queue, or (queue disabled) straight to each length class's pool: the baseline.

    ``pools``: (name, accepts, prefers) of each pool, in config order; ``longest_drain_s``: the longest
    ``graceful_shutdown_timeout_s`` among them."""
    if config.enabled:
        return QueueAdmission(config, metrics, longest_drain_s=longest_drain_s)
    return DirectAdmission({c.name: pool_for_class(pools, c.name) for c in config.length_classes})


def admission_error(exc: Exception, retry_after_s: int) -> GatewayError:
    """The client-facing error for a failed admission: 429 (rate limits, full, timed out) or 503 (queue
    unreachable)."""
    if isinstance(exc, QueueRateLimited):
        return RateLimited.after(exc.retry_after_s)
    if isinstance(exc, QueueRejected):
        return QueueFull(f"The queue for this priority band is full ({exc.reason}); retry later.",
                         reason="rejected-saturated", retry_after_s=retry_after_s)
    if isinstance(exc, QueueDeadlineExpired):
        return QueueTimeout("No capacity became free before the request's queueing deadline.",
                            reason="rejected-ttl-expired", retry_after_s=retry_after_s)
    if isinstance(exc, QueueTicketLost):
        return QueueUnavailable("The global queue lost this request's place (it restarted); retry now.",
                                reason="queue-unavailable", retry_after_s=1)
    return QueueUnavailable("The global queue is unavailable; retry shortly.", reason="queue-unavailable",
                            retry_after_s=1)
