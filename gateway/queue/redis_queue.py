"""Typed wrappers around the global queue's Lua scripts, for asyncio (gateway) and blocking (tools, tests).

Each script is ``lib.lua`` followed by its own ``.lua`` file, registered once with redis-py's
``register_script`` (EVALSHA, reloaded automatically after a Redis restart).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from gateway.queue.keys import QueueKeys
from policies.types import BandPolicy, Grant, ReplicaCapacity, TicketSpec

LUA_DIR = Path(__file__).with_name("lua")
SCRIPT_NAMES = (
    "enqueue", "register_replica", "deregister_replica", "complete", "cancel", "requeue", "renew", "expire",
    "snapshot",
)  # fmt: skip


@cache
def script_source(name: str) -> str:
    """The full Lua source of one script: the shared library, then the script body."""
    return (LUA_DIR / "lib.lua").read_text() + "\n" + (LUA_DIR / f"{name}.lua").read_text()


@dataclass(frozen=True)
class QueueSettings:
    """Static settings every script receives: the bands (highest first) and the lease lengths."""

    bands: tuple[BandPolicy, ...]
    lease_ms: int = 15_000
    max_grants: int = 256
    inbox_ttl_ms: int = 60_000

    def to_json(self) -> str:
        """The config JSON passed to every script call."""
        return json.dumps({
            "bands": [
                {"name": b.name, "aging_ms": b.aging_ms, "max_queued": b.max_queued,
                 "max_queued_tokens": b.max_queued_tokens}
                for b in self.bands
            ],
            "max_grants": self.max_grants, "lease_ms": self.lease_ms, "inbox_ttl_ms": self.inbox_ttl_ms,
        })  # fmt: skip


@dataclass(frozen=True)
class EnqueueResult:
    """Outcome of an enqueue: ``status`` is 'admitted' or a rejection reason; grants made meanwhile."""

    status: str
    grants: list[Grant] = field(default_factory=list)

    @property
    def admitted(self) -> bool:
        """True when the ticket entered the queue."""
        return self.status == "admitted"


def lua_mapping(value: Any) -> dict[str, Any]:
    """A Lua table decoded from a script's JSON as a dict (cjson encodes an empty table as [] or {})."""
    return value if isinstance(value, dict) else {}


def _grants(raw: Any) -> list[Grant]:
    # cjson encodes an empty Lua table as {}, not []
    return [Grant(*item) for item in raw] if isinstance(raw, list) else []


def _replica_payload(capacity: ReplicaCapacity, lease_ms: int) -> dict[str, Any]:
    return {
        "replica_id": capacity.replica_id, "slots_total": capacity.slots_total,
        "tokens_total": capacity.tokens_total, "accepts": sorted(capacity.accepts),
        "prefers": sorted(capacity.prefers), "pool": capacity.pool,
        "lease_ms": lease_ms,
    }  # fmt: skip


def _ticket_payload(spec: TicketSpec) -> dict[str, Any]:
    return {
        "ticket_id": spec.ticket_id, "tenant": spec.tenant, "band": spec.band, "cost": spec.cost,
        "weight": float(spec.weight), "class": spec.length_class, "owner": spec.owner, "flow": spec.flow,
    }  # fmt: skip


class _QueueBase:
    def __init__(self, keys: QueueKeys, settings: QueueSettings) -> None:
        self.keys = keys
        self.settings = settings
        self._config_json = settings.to_json()

    def _args(self, payload: dict[str, Any], now_ms: int | None) -> list[str]:
        now = "" if now_ms is None else str(int(now_ms))
        return [self.keys.prefix, self._config_json, now, json.dumps(payload)]


class RedisGlobalQueue(_QueueBase):
    """The global queue for asyncio code (the gateway and the replicas)."""

    def __init__(self, client: aioredis.Redis, keys: QueueKeys, settings: QueueSettings) -> None:
        super().__init__(keys, settings)
        self.client = client
        self._scripts = {name: client.register_script(script_source(name)) for name in SCRIPT_NAMES}

    async def _call(self, name: str, payload: dict[str, Any], now_ms: int | None) -> dict[str, Any]:
        raw = await self._scripts[name](keys=[self.keys.meta], args=self._args(payload, now_ms))
        return json.loads(raw)

    async def enqueue(self, spec: TicketSpec, now_ms: int | None = None) -> EnqueueResult:
        """Admit ``spec`` (or reject it); dispatch runs in the same atomic step."""
        result = await self._call("enqueue", _ticket_payload(spec), now_ms)
        return EnqueueResult(result["status"], _grants(result["grants"]))

    async def register_replica(self, capacity: ReplicaCapacity, lease_ms: int, now_ms: int | None = None) -> list[Grant]:
        """Register or renew a replica's capacity lease."""
        return _grants((await self._call("register_replica", _replica_payload(capacity, lease_ms), now_ms))["grants"])

    async def deregister_replica(self, replica_id: str, now_ms: int | None = None) -> list[Grant]:
        """Remove a replica at once (graceful shutdown)."""
        return _grants((await self._call("deregister_replica", {"replica_id": replica_id}, now_ms))["grants"])

    async def complete(self, ticket_id: str, actual_cost: int, now_ms: int | None = None) -> bool:
        """Return a granted ticket's capacity and charge ``actual_cost``; False if it was not granted."""
        payload = {"ticket_id": ticket_id, "actual_cost": int(actual_cost)}
        return bool((await self._call("complete", payload, now_ms))["done"])

    async def cancel(self, ticket_id: str, now_ms: int | None = None) -> tuple[str, str, str]:
        """Withdraw a waiting ticket: ('cancelled', '', ''), ('granted', replica_id, pool) or ('unknown', '', '')."""
        result = await self._call("cancel", {"ticket_id": ticket_id}, now_ms)
        return result["status"], result["replica_id"], result.get("pool") or ""

    async def requeue(self, ticket_id: str, now_ms: int | None = None) -> bool:
        """Put a granted ticket back at the head of its queue (its replica was gone)."""
        return bool((await self._call("requeue", {"ticket_id": ticket_id}, now_ms))["moved"])

    async def renew(self, ticket_ids: list[str], now_ms: int | None = None) -> list[str]:
        """Extend these tickets' leases; returns the ids that no longer exist."""
        if not ticket_ids:
            return []
        payload = {"ticket_ids": ticket_ids, "lease_ms": self.settings.lease_ms}
        missing = (await self._call("renew", payload, now_ms))["missing"]
        return list(missing) if isinstance(missing, list) else []

    async def expire(self, now_ms: int | None = None) -> list[Grant]:
        """Reap expired leases and dispatch."""
        return _grants((await self._call("expire", {}, now_ms))["grants"])

    async def snapshot(self, now_ms: int | None = None) -> dict[str, Any]:
        """Bands, counters, queue depths, replicas and totals, as one consistent read."""
        return await self._call("snapshot", {}, now_ms)


class BlockingGlobalQueue(_QueueBase):
    """The same queue for blocking code: the status CLI, the simulator, property tests."""

    def __init__(self, client: redis.Redis, keys: QueueKeys, settings: QueueSettings) -> None:
        super().__init__(keys, settings)
        self.client = client
        self._scripts = {name: client.register_script(script_source(name)) for name in SCRIPT_NAMES}

    def _call(self, name: str, payload: dict[str, Any], now_ms: int | None) -> dict[str, Any]:
        return json.loads(self._scripts[name](keys=[self.keys.meta], args=self._args(payload, now_ms)))

    def enqueue(self, spec: TicketSpec, now_ms: int | None = None) -> EnqueueResult:
        """See RedisGlobalQueue.enqueue."""
        result = self._call("enqueue", _ticket_payload(spec), now_ms)
        return EnqueueResult(result["status"], _grants(result["grants"]))

    def register_replica(self, capacity: ReplicaCapacity, lease_ms: int, now_ms: int | None = None) -> list[Grant]:
        """See RedisGlobalQueue.register_replica."""
        return _grants(self._call("register_replica", _replica_payload(capacity, lease_ms), now_ms)["grants"])

    def deregister_replica(self, replica_id: str, now_ms: int | None = None) -> list[Grant]:
        """See RedisGlobalQueue.deregister_replica."""
        return _grants(self._call("deregister_replica", {"replica_id": replica_id}, now_ms)["grants"])

    def complete(self, ticket_id: str, actual_cost: int, now_ms: int | None = None) -> tuple[bool, list[Grant]]:
        """See RedisGlobalQueue.complete; also returns the grants the freed capacity made."""
        result = self._call("complete", {"ticket_id": ticket_id, "actual_cost": int(actual_cost)}, now_ms)
        return bool(result["done"]), _grants(result["grants"])

    def cancel(self, ticket_id: str, now_ms: int | None = None) -> tuple[str, list[Grant]]:
        """See RedisGlobalQueue.cancel; returns the status and the grants made meanwhile."""
        result = self._call("cancel", {"ticket_id": ticket_id}, now_ms)
        return result["status"], _grants(result["grants"])

    def requeue(self, ticket_id: str, now_ms: int | None = None) -> tuple[bool, list[Grant]]:
        """See RedisGlobalQueue.requeue."""
        result = self._call("requeue", {"ticket_id": ticket_id}, now_ms)
        return bool(result["moved"]), _grants(result["grants"])

    def renew(self, ticket_ids: list[str], now_ms: int | None = None) -> int:
        """See RedisGlobalQueue.renew."""
        payload = {"ticket_ids": ticket_ids, "lease_ms": self.settings.lease_ms}
        return int(self._call("renew", payload, now_ms)["alive"])

    def expire(self, now_ms: int | None = None) -> list[Grant]:
        """See RedisGlobalQueue.expire."""
        return _grants(self._call("expire", {}, now_ms)["grants"])

    def snapshot(self, now_ms: int | None = None) -> dict[str, Any]:
        """See RedisGlobalQueue.snapshot."""
        return self._call("snapshot", {}, now_ms)
