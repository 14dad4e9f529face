"""Classification and admission through the global queue, and the accounting of each admitted request.

Every admitted request ends exactly once in :meth:`TicketAccounting.finish`: its grant's capacity goes
back to the replica and its tenant is charged the tokens actually served (0 when nothing was served).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from gateway.accounting import StreamUsage
from gateway.config import QueueConfig
from gateway.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidHeader,
    QueueFull,
    QueueTimeout,
    QueueUnavailable,
    UpstreamUnavailable,
)
from gateway.queue.session import QueueDeadlineExpired, QueueRejected, QueueSession
from gateway.request_parsing import ParsedRequest
from gateway.tokens import PromptTokenCounter
from policies.classification import LengthClasses, estimate_cost
from policies.types import Grant, TicketSpec
from replicas.deployment import MISROUTED

logger = logging.getLogger(__name__)

PRIORITY_HEADER = "x-priority"
TENANT_HEADER = "x-tenant-id"
ANONYMOUS_TENANT = "anonymous"
MAX_REQUEUES = 3


@dataclass
class Ticket:
    """A classified request on its way through the queue."""

    spec: TicketSpec
    parsed: ParsedRequest
    prompt_tokens: int
    client_wants_usage: bool
    created: float


class Admission:
    """Classify requests and admit them through the global queue (one per gateway replica)."""

    def __init__(self, config: QueueConfig, model_path: str) -> None:
        self.config = config
        self._counter = PromptTokenCounter(model_path)
        self._lengths = LengthClasses(long_above=config.long_prompt_above)
        self._band_priority = {band.name: index for index, band in enumerate(config.bands)}
        self._session: QueueSession | None = None

    async def session(self) -> QueueSession:
        """The replica's queue session, created on the serving event loop on first use."""
        if self._session is None:
            from gateway.queue.factory import global_queue, redis_client

            client = redis_client(self.config)
            self._session = QueueSession(global_queue(self.config, client), redis_client(self.config))
            await self._session.start()
        return self._session

    async def classify(self, parsed: ParsedRequest, headers: Mapping[str, str], max_model_len: int) -> Ticket:
        """Tenant, band, prompt tokens, length class and cost of a request; the body gets its vLLM priority."""
        tenant = ANONYMOUS_TENANT
        if self.config.trust_tenant_header:
            tenant = headers.get(TENANT_HEADER) or ANONYMOUS_TENANT
        band = headers.get(PRIORITY_HEADER) or self.config.default_band
        if band not in self._band_priority:
            raise InvalidHeader(f"Unknown {PRIORITY_HEADER} {band!r}; use one of {list(self._band_priority)}.",
                                param=PRIORITY_HEADER)
        prompt_tokens = await self._counter.count(parsed)
        if max_model_len and prompt_tokens + (parsed.max_tokens or 1) > max_model_len:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {max_model_len} tokens; the prompt has {prompt_tokens} "
                f"tokens and {parsed.max_tokens or 1} more were requested.",
                param="messages" if parsed.endpoint == "chat" else "prompt",
            )
        cost = estimate_cost(prompt_tokens, parsed.max_tokens, self.config.default_output_tokens,
                             max_model_len or prompt_tokens + self.config.default_output_tokens)
        parsed.body["priority"] = self._band_priority[band]
        client_wants_usage = bool((parsed.body.get("stream_options") or {}).get("include_usage"))
        if parsed.stream:
            parsed.body["stream_options"] = {**(parsed.body.get("stream_options") or {}), "include_usage": True}
        session = await self.session()
        spec = TicketSpec(
            ticket_id=session.new_ticket_id(), tenant=tenant, band=band, cost=cost,
            weight=self.config.tenant_weights.get(tenant, 1.0), length_class=self._lengths.classify(prompt_tokens),
            owner=session.owner,
        )
        return Ticket(spec, parsed, prompt_tokens, client_wants_usage, time.monotonic())

    async def run(
        self,
        ticket: Ticket,
        forward: Callable[[str], Any],
        respond: Callable[[Any, "TicketAccounting"], Awaitable[Any]],
    ) -> Any:
        """Admit ``ticket``, wait for its grant, then hand the granted replica's reply to ``respond``."""
        session = await self.session()
        grant = await self.await_grant(session.admit(ticket.spec, self.config.max_wait_s))
        accounting = TicketAccounting(self, session, ticket, grant, forward, respond)
        return await respond(forward(grant.replica_id), accounting)

    async def await_grant(self, waiting: Awaitable[Grant]) -> Grant:
        """Await a grant; admission failures become the client-facing 429 / 503 errors."""
        try:
            return await waiting
        except (QueueRejected, QueueDeadlineExpired, redis.RedisError) as exc:
            raise admission_error(exc, self.config.retry_after_s) from None


def admission_error(exc: Exception, retry_after_s: int) -> GatewayError:
    """The client-facing error for a failed admission: 429 (full, timed out) or 503 (queue unreachable)."""
    if isinstance(exc, QueueRejected):
        return QueueFull(f"The queue for this priority band is full ({exc.reason}); retry later.",
                         reason="rejected-saturated", retry_after_s=retry_after_s)
    if isinstance(exc, QueueDeadlineExpired):
        return QueueTimeout("No capacity became free before the request's queueing deadline.",
                            reason="rejected-ttl-expired", retry_after_s=retry_after_s)
    logger.warning("global queue unavailable: %s", type(exc).__name__)
    return QueueUnavailable("The global queue is unavailable; retry shortly.", reason="queue-unavailable",
                            retry_after_s=1)


class TicketAccounting:
    """How one admitted request ends: exactly one ``finish`` (capacity back, tokens charged)."""

    def __init__(self, admission: Admission, session: QueueSession, ticket: Ticket, grant: Grant,
                 forward: Callable[[str], Any], respond: Callable[..., Awaitable[Any]]) -> None:
        self._admission, self._session, self._ticket, self._grant = admission, session, ticket, grant
        self._forward, self._respond = forward, respond
        self._queue_ms = (time.monotonic() - ticket.created) * 1000
        self._requeues = 0
        self._usage: StreamUsage | None = None
        self._finished = False

    def response_headers(self) -> dict[str, str]:
        """Headers that tell the client how its request was classified and how long it queued."""
        return {
            "x-fleetgate-band": self._ticket.spec.band,
            "x-fleetgate-length-class": self._ticket.spec.length_class,
            "x-fleetgate-queue-ms": f"{self._queue_ms:.1f}",
            "x-fleetgate-prompt-tokens": str(self._ticket.prompt_tokens),
            "x-fleetgate-gateway": self._session.owner,
        }

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
            self._session.wait_again(self._ticket.spec, self._admission.config.max_wait_s)
        )
        return await self._respond(self._forward(self._grant.replica_id), self)

    def stream_usage(self) -> StreamUsage:
        """The watcher of this request's stream (it also decides whether the usage chunk is shown)."""
        self._usage = StreamUsage(self._ticket.prompt_tokens, self._ticket.client_wants_usage)
        return self._usage

    async def stream_ended(self) -> None:
        """The stream ended (completed, failed or the client left): charge what it served."""
        await self.finish(self._usage.total_tokens if self._usage else 0)

    async def finished(self, total_tokens: int | None) -> None:
        """A non-streamed reply completed with vLLM's usage figure."""
        await self.finish(total_tokens if total_tokens is not None else self._ticket.prompt_tokens)

    async def failed(self) -> None:
        """The replica answered with an error or failed before serving anything."""
        await self.finish(0)

    async def finish(self, served_tokens: int) -> None:
        """Return the capacity and charge ``served_tokens``, once; survives the caller's cancellation."""
        if self._finished:
            return
        self._finished = True
        try:
            await asyncio.shield(self._session.finish(self._ticket.spec.ticket_id, served_tokens))
        except redis.RedisError as exc:  # the lease expires instead and returns the capacity
            logger.warning("could not finish ticket (%s); its lease will expire", type(exc).__name__)
