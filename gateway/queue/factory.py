"""Build the queue objects from config (one place for connection settings)."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from gateway.config import QueueConfig
from gateway.queue.keys import QueueKeys
from gateway.queue.redis_queue import QueueSettings, RedisGlobalQueue
from policies.types import BandPolicy


def queue_settings(config: QueueConfig) -> QueueSettings:
    """Script settings (bands highest first, leases) from the queue config."""
    bands = tuple(
        BandPolicy(b.name, aging_ms=int(b.aging_s * 1000), max_queued=b.max_queued,
                   max_queued_tokens=b.max_queued_tokens)
        for b in config.bands
    )
    return QueueSettings(bands=bands, lease_ms=int(config.lease_s * 1000))


def redis_client(config: QueueConfig) -> aioredis.Redis:
    """An asyncio Redis client for the configured URL (AUTH and TLS come from the URL).

    A pooled connection that Redis closed (a restart) fails on its next use; such a connection error is
    retried on a fresh connection, twice, so one restart costs no request. Timeouts are not retried: the
    command may have run. The scripts tolerate a repeat (complete, cancel and renew are idempotent, and an
    enqueue that already went through reports "duplicate", taken as admitted).
    """
    retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 2, supported_errors=(redis.ConnectionError,))
    return aioredis.Redis.from_url(config.resolved_redis_url(), socket_connect_timeout=2, health_check_interval=10,
                                   retry=retry)


def global_queue(config: QueueConfig, client: aioredis.Redis) -> RedisGlobalQueue:
    """The global queue of the configured namespace on ``client``."""
    return RedisGlobalQueue(client, QueueKeys(namespace=config.namespace), queue_settings(config))
