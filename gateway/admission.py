"""Admission through the global queue (rate limits, ticket, grant), and the accounting of each admitted request.

Every admitted request ends exactly once in :meth:`TicketAccounting.finish`: its grant's capacity goes
back to the replica, its tenant's counter is corrected to the tokens actually served (0 when nothing was
served) and its rate-limit bucket is settled to the same figure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis

from gateway.accounting import RequestOutcome
from gateway.config import QueueConfig
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
from gateway.metrics import GatewayMetrics
from gateway.queue.rate_limits import RateLimiter
from gateway.queue.session import QueueDeadlineExpired, QueueRejected, QueueSession, QueueTicketLost
from gateway.request_parsing import ParsedRequest
from gateway.tenants import Tenant
from policies.priority import BandDecision
from policies.types import Grant, TicketSpec
from replicas.deployment import MISROUTED

logger = logging.getLogger(__name__)

MAX_REQUEUES = 3


@dataclass
class Ticket:
    """A classified request on its way through the queue."""

    spec: TicketSpec
    parsed: ParsedRequest
    tenant: Tenant
    decision: BandDecision
    prompt_tokens: int
    client_wants_usage: bool
    arrived: float
    max_wait_s: float

    def headers(self) -> dict[str, str]:
        """How the request was classified, for the response headers."""
        headers = {
            "x-fleetgate-band": self.spec.band,
            "x-fleetgate-length-class": self.spec.length_class,
            "x-fleetgate-prompt-tokens": str(self.prompt_tokens),
        }
        return headers | band_headers(self.decision)


def band_headers(decision: BandDecision) -> dict[str, str]:
    """Headers that say the request was lowered to its tenant's allowance (none when it was not)."""
    if not decision.capped:
        return {}
    return {"x-fleetgate-band-capped": "true", "x-fleetgate-requested-band": decision.requested}


class Admission:
    """Turns classified requests into tickets and admits them through the global queue (one per gateway replica)."""

    def __init__(self, config: QueueConfig, metrics: GatewayMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self._session: QueueSession | None = None
        self._rates: RateLimiter | None = None

    async def session(self) -> QueueSession:
        """The replica's queue session, created on the serving event loop on first use."""
        if self._session is None:
            from gateway.queue.factory import global_queue, redis_client

            client = redis_client(self.config)
            queue = global_queue(self.config, client)
            self._rates = RateLimiter(client, queue.keys)
            self._session = QueueSession(queue, redis_client(self.config))
            await self._session.start()
        return self._session

    async def ticket(self, parsed: ParsedRequest, tenant: Tenant, decision: BandDecision, asked: RequestHeaders,
                     size: Classification, arrived: float) -> Ticket:
        """The request's ticket; the body gets its band's vLLM priority and always asks for stream usage."""
        parsed.body["priority"] = self.config.vllm_priority(decision.band)
        client_wants_usage = bool((parsed.body.get("stream_options") or {}).get("include_usage"))
        if parsed.stream:
            parsed.body["stream_options"] = {**(parsed.body.get("stream_options") or {}), "include_usage": True}
        session = await self.session()
        spec = TicketSpec(
            ticket_id=session.new_ticket_id(), tenant=tenant.id, band=decision.band, cost=size.cost,
            weight=tenant.weight, length_class=size.length_class, owner=session.owner, flow=asked.flow,
        )
        max_wait_s = min(self.config.max_wait_s, asked.ttft_slo_s or self.config.max_wait_s)
        return Ticket(spec, parsed, tenant, decision, size.prompt_tokens, client_wants_usage, arrived, max_wait_s)

    async def run(
        self,
        ticket: Ticket,
        forward: Callable[[Grant], Any],
        respond: Callable[[Any, RequestOutcome], Awaitable[Any]],
    ) -> Any:
        """Rate-limit and admit ``ticket``, wait for its grant, then hand the granted replica's reply to ``respond``."""
        session = await self.session()
        try:
            await self._take_rate(ticket)
            try:
                grant = await self.await_grant(session.admit(ticket.spec, ticket.max_wait_s))
            except BaseException:
                await asyncio.shield(self.settle_rate(ticket, -ticket.spec.cost))  # nothing was served
                raise
        except Rejected as exc:
            self.metrics.rejections.labels(self.metrics.tenant(ticket.spec.tenant), ticket.spec.band, exc.reason).inc()
            raise
        accounting = TicketAccounting(self, session, ticket, grant, forward, respond)
        return await respond(forward(grant), accounting)

    async def await_grant(self, waiting: Awaitable[Grant]) -> Grant:
        """Await a grant; admission failures become the client-facing 429 / 503 errors."""
        try:
            return await waiting
        except (QueueRejected, QueueDeadlineExpired, QueueTicketLost, redis.RedisError) as exc:
            raise admission_error(exc, self.config.retry_after_s) from None

    async def _take_rate(self, ticket: Ticket) -> None:
        limits = ticket.tenant.rate_limits
        try:
            decision = await self._rates.take(ticket.spec.tenant, limits, ticket.spec.cost)  # type: ignore[union-attr]
        except redis.RedisError as exc:
            raise admission_error(exc, self.config.retry_after_s) from None
        if not decision.admitted:
            raise RateLimited("This API key's rate limit is reached; retry after the time in Retry-After.",
                              reason="rate-limited", retry_after_s=max(1, int(decision.retry_after_s + 0.999)))

    async def settle_rate(self, ticket: Ticket, extra_tokens: int) -> None:
        """Correct the tenant's token bucket by ``extra_tokens`` beyond the estimate (negative: refund)."""
        try:
            await self._rates.settle(ticket.spec.tenant, ticket.tenant.rate_limits, extra_tokens)  # type: ignore[union-attr]
        except redis.RedisError as exc:  # the bucket refills on its own; only this correction is lost
            logger.warning("could not settle a rate-limit bucket: %s", type(exc).__name__)


def admission_error(exc: Exception, retry_after_s: int) -> GatewayError:
    """The client-facing error for a failed admission: 429 (full, timed out) or 503 (queue unreachable)."""
    if isinstance(exc, QueueRejected):
        return QueueFull(f"The queue for this priority band is full ({exc.reason}); retry later.",
                         reason="rejected-saturated", retry_after_s=retry_after_s)
    if isinstance(exc, QueueDeadlineExpired):
        return QueueTimeout("No capacity became free before the request's queueing deadline.",
                            reason="rejected-ttl-expired", retry_after_s=retry_after_s)
    if isinstance(exc, QueueTicketLost):
        return QueueUnavailable("The global queue lost this request's place (it restarted); retry now.",
                                reason="queue-unavailable", retry_after_s=1)
    logger.warning("global queue unavailable: %s", type(exc).__name__)
    return QueueUnavailable("The global queue is unavailable; retry shortly.", reason="queue-unavailable",
                            retry_after_s=1)


class TicketAccounting(RequestOutcome):
    """How one admitted request ends: exactly one ``finish`` (capacity back, tokens charged)."""

    def __init__(self, admission: Admission, session: QueueSession, ticket: Ticket, grant: Grant,
                 forward: Callable[[Grant], Any], respond: Callable[..., Awaitable[Any]]) -> None:
        queue_s = time.monotonic() - ticket.arrived
        headers = ticket.headers() | {"x-fleetgate-queue-ms": f"{queue_s * 1000:.1f}",
                                      "x-fleetgate-gateway": session.owner, "x-fleetgate-pool": grant.pool}
        super().__init__(admission.metrics, ticket.spec.tenant, ticket.spec.band, ticket.arrived, headers,
                         ticket.prompt_tokens, ticket.client_wants_usage)
        self._admission, self._session, self._ticket, self._grant = admission, session, ticket, grant
        self._forward, self._respond = forward, respond
        self._requeues = 0
        self._record_grant(grant, queue_s)

    def _record_grant(self, grant: Grant, queue_s: float) -> None:
        spec = self._ticket.spec
        self.metrics.grants.labels(self.metrics.tenant(spec.tenant), grant.band, spec.length_class, grant.pool).inc()
        self.metrics.queue_wait.labels(spec.band).observe(queue_s)

    def misrouted(self, header: dict[str, Any]) -> bool:
        """True when the call reached a replica other than the granted one (that one is gone)."""
        return header["status"] == MISROUTED

    async def retry(self) -> Any:
        """Requeue at the head of the tenant's queue, wait for a new grant, and forward again."""
        self._requeues += 1
        if self._requeues > MAX_REQUEUES:
            await self.failed()
            raise UpstreamUnavailable("The granted replicas kept disappearing; retry shortly.")
        self._grant = await self._admission.await_grant(
            self._session.wait_again(self._ticket.spec, self._ticket.max_wait_s)
        )
        return await self._respond(self._forward(self._grant), self)

    async def settle(self, served_tokens: int) -> None:
        """Return the capacity and charge ``served_tokens`` (the ledger, the rate bucket); survives cancellation."""
        try:
            await asyncio.shield(self._session.finish(self._ticket.spec.ticket_id, served_tokens))
        except redis.RedisError as exc:  # the lease expires instead and returns the capacity
            logger.warning("could not finish ticket (%s); its lease will expire", type(exc).__name__)
        await asyncio.shield(self._admission.settle_rate(self._ticket, served_tokens - self._ticket.spec.cost))
