"""Redis connections and the queue objects built on them, from config (the one place connection settings live)."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from fleet.config import QueueConfig
from fleet.keys import QueueKeys
from fleet.queue import GlobalQueue, QueueSettings
from policies.types import BandPolicy


def queue_settings(config: QueueConfig) -> QueueSettings:
    """Script settings (bands highest first, leases) from the queue config."""
    bands = tuple(
        BandPolicy(b.name, aging_ms=int(b.aging_s * 1000), max_queued=b.max_queued,
                   max_queued_tokens=b.max_queued_tokens, max_unstarted_steps=b.max_unstarted_steps or 1.0,
                   kv_ceiling=b.kv_ceiling or 1.0, tenant_share=b.tenant_share)
        for b in config.bands
    )
    return QueueSettings(bands=bands, lease_ms=int(config.lease_s * 1000),
                         signal_stale_ms=int(config.signal_stale_s * 1000), max_flows=config.max_flows_per_tenant)


def redis_client(config: QueueConfig, max_connections: int | None = None, url: str | None = None) -> aioredis.Redis:
    """An asyncio Redis client for ``url`` or the configured URL (AUTH and TLS come from the URL).

    Its pool is bounded and *blocking*: when every connection is busy, a call waits for one (up to
    ``redis_pool_timeout_s``) instead of raising at once, which is what redis-py's default pool does past
    its cap, turning a burst into 503s while Redis is healthy. A pooled connection that Redis closed (a
    restart) fails on its next use; such a connection error is retried on a fresh connection, twice, so one
    restart costs no request. Timeouts are not retried: the command may have run. The scripts tolerate a
    repeat (complete, cancel and renew are idempotent, and an enqueue that already went through reports
    "duplicate", taken as admitted).
    """
    retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 2, supported_errors=(redis.ConnectionError,))
    if config.redis_cluster:  # its per-node pools raise at their cap: GlobalQueue bounds the calls in flight
        return aioredis.RedisCluster.from_url(
            url or config.resolved_redis_url(), max_connections=2 * (max_connections or config.redis_max_connections),
            socket_connect_timeout=2, socket_timeout=config.redis_socket_timeout_s, retry=retry,
        )
    pool = aioredis.BlockingConnectionPool.from_url(
        url or config.resolved_redis_url(), max_connections=max_connections or config.redis_max_connections,
        timeout=config.redis_pool_timeout_s, socket_connect_timeout=2, socket_timeout=config.redis_socket_timeout_s,
        health_check_interval=10,
    )
    return aioredis.Redis(connection_pool=pool, retry=retry)


def global_queue(config: QueueConfig, client: aioredis.Redis) -> GlobalQueue:
    """The global queue of the configured namespace on ``client`` (a call that stops at its bounds is
    continued in the background)."""
    return GlobalQueue(client, QueueKeys(namespace=config.namespace), queue_settings(config), follow_up=True,
                       max_in_flight=config.redis_max_connections, use_functions=config.redis_functions)
