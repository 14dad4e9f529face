"""The ledger check every end-to-end and fault test ends with: nothing lost, nothing held, charged once.

After a test: no ticket is left in the global queue; every replica's free capacity is back to what it
registered (no grant in flight, no guarded work held); every grant ended exactly once (completed, requeued or expired with its holder);
and each tenant was charged exactly the tokens its clients saw served (when the test knows them).
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from fleet.blocking import blocking
from fleet.config import QueueConfig
from fleet.connection import queue_settings
from fleet.keys import QueueKeys
from fleet.queue import GlobalQueue
from fleet.snapshot import QueueSnapshot


@functools.cache
def _queue(redis_url: str, namespace: str) -> Any:
    # one client per URL: a fresh connection per poll would churn connections on a loaded machine;
    # a generous timeout, since a 2-core machine running vLLM can leave Redis slow to answer for a moment
    def build() -> GlobalQueue:
        # a fault test restarts Redis: a stale pooled connection is retried on a fresh one, as in production
        retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 3, supported_errors=(redis.ConnectionError,))
        client = aioredis.Redis.from_url(redis_url, socket_timeout=30, socket_connect_timeout=5, retry=retry)
        return GlobalQueue(client, QueueKeys(namespace=namespace), queue_settings(QueueConfig()))

    return blocking(build)


def snapshot(redis_url: str, namespace: str = "local") -> QueueSnapshot:
    """The global queue's snapshot (one consistent read)."""
    return _queue(redis_url, namespace).snapshot()


def served_by_tenant(redis_url: str, namespace: str = "local") -> Counter[str]:
    """Tokens charged per tenant so far (take it before a test, compare after)."""
    return Counter(snapshot(redis_url, namespace).served)


def _quiet(state: QueueSnapshot, expected_replicas: int) -> bool:
    # a replica whose heartbeat was late on a loaded machine re-registers within a third of its lease; no
    # grant is left in flight (every one was acknowledged or ended)
    return state.tickets == 0 and len(state.replicas) == expected_replicas and all(
        r.idle and r.in_flight == 0 and r.in_flight_tokens == 0 and r.guarded_held == 0 for r in state.replicas)


def assert_ledger_balanced(redis_url: str, replicas: int, *, namespace: str = "local",
                           served_before: Mapping[str, int] | None = None,
                           client_served: Mapping[str, int] | None = None, leases_may_expire: bool = False,
                           timeout_s: float = 30) -> QueueSnapshot:
    """Wait (bounded) until the queue is quiet (no ticket, every replica registered with all its capacity
    free and no grant in flight), then check the ledger; returns the final snapshot.

    ``client_served``: tokens per tenant the clients saw served (``usage.total_tokens``), compared with what
    the queue charged since ``served_before``. Unless ``leases_may_expire`` (a fault test killed a holder),
    no lease may ever have expired: a leaked ticket must not hide behind its lease.
    """
    deadline = time.monotonic() + timeout_s
    while not _quiet(state := snapshot(redis_url, namespace), replicas):
        assert time.monotonic() < deadline, f"the queue never went quiet: {state}"
        time.sleep(0.1)
    assert all(band.queued == 0 and band.queued_tokens == 0 for band in state.bands)
    assert len(state.replicas) == replicas, state.replicas
    stats = state.stats
    ended = stats.get("completed", 0) + stats.get("requeued", 0) + stats.get("expired_granted", 0)
    assert stats.get("granted", 0) == ended, stats
    if not leases_may_expire:
        assert stats.get("expired", 0) == 0, stats
    if client_served is not None:
        charged = Counter(state.served)
        charged.subtract(served_before or {})
        for tenant, tokens in client_served.items():
            assert charged[tenant] == tokens, (tenant, charged[tenant], tokens)
    return state
