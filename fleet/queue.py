"""The global queue's client: one typed method per Lua script, for asyncio code (gateways and replicas).

Each call is the shared library followed by its own ``.lua`` file, run as a Redis 7 function where the
server allows it, else as a script (:mod:`fleet.lua_calls`). Blocking code (the status CLI, tests, tools) uses
the same class through :func:`fleet.blocking.blocking`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from fleet.keys import QueueKeys
from fleet.lua_calls import LuaCalls
from fleet.snapshot import QueueSnapshot
from fleet.rate_limits import RateLimits
from policies.clock import max_step_ms
from policies.types import (
    BandPolicy,
    CancelResult,
    CompleteResult,
    EngineSignals,
    EnqueueResult,
    Grant,
    ReplicaCapacity,
    RequeueResult,
    TicketSpec,
)

logger = logging.getLogger(__name__)

RENEW_BATCH = 1000  # lease renewals per call: about 2 ms of Redis time

@dataclass(frozen=True)
class QueueSettings:
    """Static settings every script receives: the bands (highest first, with their gates), the lease
    lengths, and how old a replica's engine signals may be before the gate stops trusting them."""

    bands: tuple[BandPolicy, ...]
    lease_ms: int = 15_000
    max_grants: int = 64  # per call; a call that stops there says so, and the client dispatches again
    bulk_limit: int = 64  # per call: leases reaped, signals gone stale, tickets aged per band (64 reaped: ~4 ms)
    max_flows: int = 64  # waiting flows per tenant and band; a ticket of one more joins the overflow flow
    inbox_ttl_ms: int = 60_000
    signal_stale_ms: int = 2_000

    def to_json(self, keys: QueueKeys) -> str:
        """The config JSON passed to every script call (with the key families' prefixes)."""
        return json.dumps({
            "bands": [
                {"name": b.name, "aging_ms": b.aging_ms, "max_queued": b.max_queued,
                 "max_queued_tokens": b.max_queued_tokens, "max_unstarted_steps": float(b.max_unstarted_steps),
                 "tenant_share": float(b.tenant_share),
                 "kv_ceiling": float(b.kv_ceiling)}
                for b in self.bands
            ],
            "max_grants": self.max_grants, "bulk_limit": self.bulk_limit, "lease_ms": self.lease_ms,
            "inbox_ttl_ms": self.inbox_ttl_ms, "signal_stale_ms": self.signal_stale_ms, "max_flows": self.max_flows,
            "clock_step_ms": max_step_ms(self.lease_ms),
            "keys": keys.families(),
        })  # fmt: skip


def _grants(raw: Any) -> list[Grant]:
    # cjson encodes an empty Lua table as {}, not []
    return [Grant(*item) for item in raw] if isinstance(raw, list) else []


def _replica_payload(capacity: ReplicaCapacity, lease_ms: int) -> dict[str, Any]:
    return {
        "replica_id": capacity.replica_id, "slots_total": capacity.slots_total,
        "tokens_total": capacity.tokens_total, "accepts": sorted(capacity.accepts),
        "prefers": sorted(capacity.prefers), "guarded": sorted(capacity.guarded), "pool": capacity.pool,
        "step_tokens": capacity.step_tokens, "prefill_chunk": capacity.prefill_chunk,
        "reserve": capacity.reserve, "lease_ms": lease_ms,
    }  # fmt: skip


def _ticket_payload(spec: TicketSpec) -> dict[str, Any]:
    return {
        "ticket_id": spec.ticket_id, "tenant": spec.tenant, "band": spec.band, "cost": spec.cost,
        "weight": float(spec.weight), "class": spec.length_class, "owner": spec.owner, "flow": spec.flow,
        "prompt": spec.prefill_tokens, "ceiling": spec.ceiling,
    }  # fmt: skip


class GlobalQueue:
    """The Redis global queue of one namespace; every call is one atomic script (reap, apply, dispatch).

    Method for method the same calls, arguments and results as :class:`policies.reference_scheduler.
    ReferenceScheduler`, with an optional explicit clock (``now_ms``; None: the queue's clock, from the Redis
    server's wall clock, see :mod:`policies.clock`). ``wall_clock`` stands in for the server's wall clock
    (tests of the queue's clock).
    """

    def __init__(self, client: aioredis.Redis, keys: QueueKeys, settings: QueueSettings,
                 follow_up: bool = False, max_in_flight: int | None = None,
                 wall_clock: Callable[[], int] | None = None, use_functions: bool = True) -> None:
        self.client = client
        self.keys = keys
        self.settings = settings
        self._config_json = settings.to_json(keys)
        self._declared = keys.declared()
        self.lua = LuaCalls(client, use_functions)
        self._follow_up = follow_up
        self._following: asyncio.Task | None = None
        # calls in flight wait here rather than fail at a connection pool's cap (a cluster client's raises)
        self._in_flight = asyncio.Semaphore(max_in_flight) if max_in_flight else None
        self._wall_clock = wall_clock

    def on_client(self, client: aioredis.Redis) -> GlobalQueue:
        """The same queue through another client, with no bound on calls in flight (a lease keeper's own
        connection, so renewals never queue behind request traffic)."""
        return GlobalQueue(client, self.keys, self.settings, follow_up=self._follow_up, wall_clock=self._wall_clock,
                           use_functions=self.lua.form != "scripts")

    async def _call(self, name: str, payload: dict[str, Any], now_ms: int | None) -> dict[str, Any]:
        if now_ms is not None:
            now = str(int(now_ms))
        else:
            now = "" if self._wall_clock is None else f"~{int(self._wall_clock())}"
        args = [self._config_json, now, json.dumps(payload)]
        async with self._in_flight or contextlib.nullcontext():
            raw = await self.lua(name, self._declared, args)
        reply = json.loads(raw)
        if reply.get("more") and self._follow_up and now_ms is None:
            self._continue()
        return reply

    def _continue(self) -> None:
        """A call stopped at its bounds with work left (grants, reaping, aging): go on in the background,
        one sweep at a time, so no single script call holds Redis for long and nothing is left waiting."""
        if self._following is None or self._following.done():
            self._following = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        try:
            await self.expire()
        except Exception as exc:  # the next call or the periodic sweep picks the work up
            logger.warning("follow-up dispatch failed: %s", type(exc).__name__)

    async def enqueue(self, spec: TicketSpec, now_ms: int | None = None,
                      limits: RateLimits | None = None) -> EnqueueResult:
        """Admit ``spec`` (or reject it: the band's limits, the tenant's rate ``limits``); dispatch runs in the
        same atomic step. The tenant's token bucket is settled by ``complete`` and refunded by ``cancel``."""
        payload = _ticket_payload(spec)
        if limits is not None:
            payload |= {k: v for k, v in (("rpm", limits.requests_per_minute), ("tpm", limits.tokens_per_minute))
                        if v is not None}
        result = await self._call("enqueue", payload, now_ms)
        return EnqueueResult(result["status"], _grants(result["grants"]), int(result["retry_after_ms"]),
                             int(result.get("held_ms") or 0))

    async def register_replica(self, capacity: ReplicaCapacity, lease_ms: int, now_ms: int | None = None) -> list[Grant]:
        """Register or renew a replica's capacity lease."""
        return _grants((await self._call("register_replica", _replica_payload(capacity, lease_ms), now_ms))["grants"])

    async def report_signals(self, replica_id: str, signals: EngineSignals, received: list[str],
                             now_ms: int | None = None, progress: list[tuple[str, int]] = ()) -> list[Grant]:
        """A replica's engine report: its ``signals``, the granted tickets it ``received`` since its last
        report (their in-flight credit ends), and ``progress`` (ticket, tokens served so far) of running
        requests past what they were charged (their tenants are topped up); then dispatch."""
        payload = {"replica_id": replica_id, "unstarted": signals.unstarted,
                   "unstarted_tokens": signals.unstarted_tokens, "running": signals.running,
                   "waiting": signals.waiting, "kv": float(signals.kv_usage), "received": signals.received,
                   "acked": list(received)}
        if progress:
            payload["progress"] = [[ticket_id, int(served)] for ticket_id, served in progress]
        return _grants((await self._call("report_signals", payload, now_ms))["grants"])

    async def deregister_replica(self, replica_id: str, now_ms: int | None = None, hold_ms: int = 0) -> list[Grant]:
        """Remove a replica at once: its graceful stop, or a gateway whose router could not reach it (then
        ``hold_ms`` keeps it out that long, so its heartbeat does not bring it back while it drains)."""
        payload = {"replica_id": replica_id, "hold_ms": int(hold_ms)}
        return _grants((await self._call("deregister_replica", payload, now_ms))["grants"])

    async def complete(self, ticket_id: str, actual_cost: int, now_ms: int | None = None) -> CompleteResult:
        """Return a granted ticket's capacity and charge ``actual_cost``; ``done`` is False if it was not granted."""
        result = await self._call("complete", {"ticket_id": ticket_id, "actual_cost": int(actual_cost)}, now_ms)
        return CompleteResult(bool(result["done"]), _grants(result["grants"]))

    async def cancel(self, ticket_id: str, now_ms: int | None = None) -> CancelResult:
        """Withdraw a waiting ticket (see CancelResult for the outcomes)."""
        result = await self._call("cancel", {"ticket_id": ticket_id}, now_ms)
        return CancelResult(result["status"], _grants(result["grants"]), result["replica_id"], result["pool"])

    async def requeue(self, ticket_id: str, now_ms: int | None = None) -> RequeueResult:
        """Put a granted ticket back at the head of its queue (its replica was gone)."""
        result = await self._call("requeue", {"ticket_id": ticket_id}, now_ms)
        return RequeueResult(bool(result["moved"]), _grants(result["grants"]))

    async def renew(self, ticket_ids: list[str], now_ms: int | None = None) -> list[str]:
        """Extend these tickets' leases (a bounded batch per call); returns the ids that no longer exist."""
        missing: list[str] = []
        for start in range(0, max(len(ticket_ids), 1), RENEW_BATCH):  # one call even for none: it reaps
            payload = {"ticket_ids": ticket_ids[start:start + RENEW_BATCH], "lease_ms": self.settings.lease_ms}
            found = (await self._call("renew", payload, now_ms))["missing"]
            missing += found if isinstance(found, list) else []
        return missing

    async def expire(self, now_ms: int | None = None) -> list[Grant]:
        """Reap expired leases and dispatch."""
        return _grants((await self._call("expire", {}, now_ms))["grants"])

    async def snapshot(self, now_ms: int | None = None) -> QueueSnapshot:
        """Bands, counters, queue depths, replicas and totals, as one consistent read."""
        return QueueSnapshot.model_validate(await self._call("snapshot", {}, now_ms))
