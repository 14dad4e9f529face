"""One gateway replica's connection to the global queue: admit, wait for a grant, finish, renew leases.

Waiting is event-driven: each gateway replica blocks on one Redis list (its inbox) into which the dispatch
step pushes grants, and resolves the waiting request's future; no request polls. A background task renews
the leases of every ticket this replica owns, so if the replica dies its tickets expire and their
capacity returns to the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from fleet.metrics_board import MetricsBoard
from fleet.outage_log import OutageLog
from fleet.queue import GlobalQueue
from fleet.rate_limits import RateLimits
from policies.types import Grant, TicketSpec

logger = logging.getLogger(__name__)


class QueueRejected(Exception):
    """The band's admission limits are reached (queue full): answer 429."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class QueueRateLimited(Exception):
    """The tenant's rate limits are reached: answer 429 with how long to wait."""

    def __init__(self, retry_after_s: float, held_s: float = 0.0) -> None:
        super().__init__(f"retry after {retry_after_s:.3f} s")
        self.retry_after_s = retry_after_s
        self.held_s = held_s  # until any request of the tenant could pass (0: a smaller one could now)


class QueueDeadlineExpired(Exception):
    """No grant came before the ticket's deadline; the ticket was withdrawn."""


class QueueTicketLost(Exception):
    """The queue no longer has the waiting ticket (Redis restarted empty, or its lease lapsed)."""


@dataclass
class AdmitTiming:
    """When an admission's enqueue returned, on the caller's clock, for the per-stage timing of its request."""

    clock: Callable[[], float] = time.monotonic
    enqueued_at: float | None = None


class QueueSession:
    """Admission through the global queue for one gateway replica (owner of its tickets)."""

    def __init__(self, queue: GlobalQueue, side_client: aioredis.Redis, owner: str | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.queue = queue
        self._sleep = sleep  # the lease keeper's pause (tests drive it)
        self.owner = owner or f"gw-{uuid.uuid4().hex[:16]}"
        # the inbox listener and the lease keeper have their own connections (``side_client``, two are
        # enough): under a burst, request traffic queues for the main pool, and renewals must not wait
        # behind it, or the leases of waiting tickets lapse
        self._blocking = side_client
        self._leases = queue.on_client(side_client)
        self._waiting: dict[str, asyncio.Future[Grant]] = {}
        self._owned: set[str] = set()
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self._inbox_outage = OutageLog(logger, "the grant inbox")
        self._lease_outage = OutageLog(logger, "lease renewal")

    async def start(self) -> None:
        """Start the inbox listener and the lease keeper (idempotent)."""
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._keep_leases())]

    async def close(self) -> None:
        """Stop the background tasks and close the Redis connections."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:  # a BLPOP being cancelled can linger in redis-py; do not wait on it for long
            await asyncio.wait(self._tasks, timeout=2)
        self._tasks = []
        for client in {id(c): c for c in (self._blocking, self.queue.client)}.values():
            with contextlib.suppress(Exception):
                await client.aclose()

    def metrics_board(self, ttl_s: float) -> MetricsBoard:
        """The fleet's metrics board on this session's Redis connection."""
        return MetricsBoard(self.queue.client, self.queue.keys, ttl_s)

    @property
    def owned(self) -> frozenset[str]:
        """Tickets this replica holds (waiting or running)."""
        return frozenset(self._owned)

    def new_ticket_id(self) -> str:
        """A fresh ticket id (also used as the request's engine id suffix)."""
        return uuid.uuid4().hex

    async def admit(self, spec: TicketSpec, timeout_s: float, limits: RateLimits | None = None,
                    timing: AdmitTiming | None = None) -> Grant:
        """Enqueue ``spec`` (its tenant's rate ``limits`` taken in the same step) and wait up to ``timeout_s``
        for its grant.

        Raises QueueRateLimited, QueueRejected (band limits), QueueDeadlineExpired (withdrawn after the
        deadline) or a Redis error.
        If the caller is cancelled while waiting, the ticket is withdrawn (or, if a grant won the race,
        finished at zero cost) before the cancellation propagates.
        """
        await self.start()

        async def enqueue() -> list[Grant]:
            result = await self.queue.enqueue(spec, limits=limits)
            # "duplicate": a retried enqueue whose first attempt went through (ids are ours alone); its
            # grant, if it has one, comes back with it
            if result.status == "rate_limited":
                raise QueueRateLimited(result.retry_after_ms / 1000, result.held_ms / 1000)
            if not result.admitted and result.status != "duplicate":
                raise QueueRejected(result.status)
            self._owned.add(spec.ticket_id)
            if timing is not None:
                timing.enqueued_at = timing.clock()
            return result.grants

        return await self._wait_for_grant(spec, timeout_s, enqueue)

    async def wait_again(self, spec: TicketSpec, timeout_s: float) -> Grant:
        """Put a granted ticket back at the head of its queue and wait for its next grant."""

        async def requeue() -> list[Grant]:
            result = await self.queue.requeue(spec.ticket_id)
            if not result.moved:
                raise QueueDeadlineExpired()
            return result.grants

        return await self._wait_for_grant(spec, timeout_s, requeue)

    async def _wait_for_grant(
        self, spec: TicketSpec, timeout_s: float, submit: Callable[[], Awaitable[list[Grant]]]
    ) -> Grant:
        # the future exists before the ticket does, so a grant pushed at once is never missed
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._waiting[spec.ticket_id] = future
        try:
            for grant in await submit():
                if grant.ticket_id == spec.ticket_id and not future.done():
                    future.set_result(grant)
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except asyncio.TimeoutError:
            try:
                grant = await self._withdraw(spec)
            except Exception:  # Redis failed the withdrawal: stop renewing, so its lease lapses and frees it
                self._owned.discard(spec.ticket_id)
                raise
            if grant is None:
                raise QueueDeadlineExpired() from None
            return grant
        except asyncio.CancelledError:
            await asyncio.shield(self._abandon(spec))
            raise
        finally:
            self._waiting.pop(spec.ticket_id, None)

    async def finish(self, ticket_id: str, actual_cost: int) -> bool:
        """Release the grant's capacity and charge ``actual_cost`` (exactly once; later calls are no-ops)."""
        try:
            return (await self.queue.complete(ticket_id, actual_cost)).done
        finally:
            self._owned.discard(ticket_id)

    async def _withdraw(self, spec: TicketSpec) -> Grant | None:
        result = await self.queue.cancel(spec.ticket_id)
        if result.status == "granted":  # the grant won the race with the deadline: use it
            return Grant(spec.ticket_id, result.replica_id, spec.band, spec.tenant, result.pool)
        self._owned.discard(spec.ticket_id)
        return None

    async def _abandon(self, spec: TicketSpec) -> None:
        try:
            if (await self.queue.cancel(spec.ticket_id)).status == "granted":
                await self.queue.complete(spec.ticket_id, 0)
        except Exception:  # Redis gone: the ticket's lease expires instead
            logger.warning("could not withdraw an abandoned ticket; its lease will expire")
        finally:
            self._owned.discard(spec.ticket_id)

    async def _listen(self) -> None:
        inbox = self.queue.keys.inbox(self.owner)
        while not self._closing:
            try:
                item = await self._blocking.blpop([inbox], timeout=1)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis restarting: back off briefly, leases cover the gap
                if self._closing:  # redis-py may surface our own cancellation as a ConnectionError
                    return
                self._inbox_outage.failed(exc)
                await asyncio.sleep(0.5)
                continue
            self._inbox_outage.succeeded()
            if item is None:
                continue
            self._deliver(item[1])
            try:  # whatever else waits in the inbox, in the same turn
                for raw in await self._blocking.lpop(inbox, 256) or []:
                    self._deliver(raw)
            except Exception:  # the next BLPOP picks it up
                continue

    def _deliver(self, raw: bytes) -> None:
        message = json.loads(raw)
        future = self._waiting.get(message["ticket_id"])
        if future is not None and not future.done():
            future.set_result(Grant(message["ticket_id"], message["replica_id"], message["band"], message["tenant"],
                                     message.get("pool", "default")))

    def _fail_lost(self, missing: list[str]) -> None:
        """Answer the waiters whose tickets the queue lost, now rather than at their deadline."""
        for ticket_id in missing:
            future = self._waiting.get(ticket_id)
            if future is not None and not future.done():
                future.set_exception(QueueTicketLost(ticket_id))
                future.exception()  # retrieved here: a waiter already leaving must not log it as unhandled
                logger.warning("a waiting ticket was lost by the queue (Redis restarted?); answering its request")

    async def _keep_leases(self) -> None:
        period = max(self.queue.settings.lease_ms / 3000, 0.2)
        while not self._closing:
            await self._sleep(period)
            try:
                if self._owned:
                    missing = await self._leases.renew(sorted(self._owned))
                    self._owned.difference_update(missing)  # gone from the queue: nothing left to renew
                    self._fail_lost(missing)
                await self._leases.expire()  # also reaps other gateways' and replicas' lapsed leases
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._lease_outage.failed(exc)
            else:
                self._lease_outage.succeeded()
