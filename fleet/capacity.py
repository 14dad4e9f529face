"""A replica's capacity registration with the global queue: registered at start, renewed by heartbeat.

A replica whose heartbeat stops (actor died, node lost) lets its lease lapse; the dispatch step then
stops granting to it. A graceful stop deregisters at once.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import AuthenticationError, AuthorizationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fleet.config import QueueConfig
from fleet.connection import global_queue, redis_client
from fleet.metrics_board import MetricsBoard, MetricsPublisher
from fleet.outage_log import OutageLog
from policies.types import ReplicaCapacity

logger = logging.getLogger(__name__)


class CapacityRegistration:
    """Keeps one replica's capacity lease alive in the global queue."""

    def __init__(self, config: QueueConfig, capacity: ReplicaCapacity) -> None:
        self.queue = global_queue(config, redis_client(config))
        self._capacity = capacity
        self._lease_ms = int(config.lease_s * 1000)
        self._task: asyncio.Task | None = None
        self._metrics: MetricsPublisher | None = None
        self._outage = OutageLog(logger, "the capacity heartbeat")

    async def start(self) -> None:
        """Register now, then renew in the background. A Redis that does not answer yet (started after the
        replicas, or restarting) is waited for: the renewals register the replica as soon as it answers, and
        until then the queue grants it nothing. Failing the start instead made Ray Serve give the deployment
        up after three tries (still so once Redis answered). Any other failure (a wrong password, a namespace
        of another state version: the config's, which no wait mends) fails it."""
        try:
            await self.queue.register_replica(self._capacity, self._lease_ms)
        except (AuthenticationError, AuthorizationError):
            raise
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            logger.warning("the global queue's Redis does not answer (%s); this replica registers when it does",
                           type(exc).__name__)
        self._task = asyncio.create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self._lease_ms / 3000)
            try:
                await self.queue.register_replica(self._capacity, self._lease_ms)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis restarting: keep trying; the lease bridges short gaps
                self._outage.failed(exc)
            else:
                self._outage.succeeded()

    def publish_metrics(self, interval_s: float) -> None:
        """Publish this process's Prometheus registry (vLLM's own ``vllm:*`` metrics) to the fleet's board."""
        from prometheus_client import REGISTRY, generate_latest

        board = MetricsBoard(self.queue.client, self.queue.keys, ttl_s=3 * interval_s)
        replica = self._capacity.replica_id
        self._metrics = MetricsPublisher(board, f"replica:{replica}", {"replica": replica, "pool": self._capacity.pool},
                                         lambda: generate_latest(REGISTRY), interval_s)
        self._metrics.start()

    def stop(self) -> None:
        """Stop renewing; the lease lapses unless :meth:`deregister` removes it at once."""
        if self._task is not None:
            self._task.cancel()
        if self._metrics is not None:
            self._metrics.stop()

    async def holds_grant(self, ticket_id: str) -> bool:
        """True when the queue granted ``ticket_id`` to this replica (a Redis failure counts as yes: a
        request granted before Redis went away still runs)."""
        try:
            granted_to = await self.queue.client.hget(self.queue.keys.ticket(ticket_id), "granted_to")
        except Exception as exc:
            logger.warning("could not check a grant (%s); serving it", type(exc).__name__)
            return True
        return granted_to is not None and granted_to.decode() == self._capacity.replica_id

    async def deregister(self, timeout_s: float = 2.0) -> None:
        """Leave the fleet at once (a graceful stop): no grant comes here any more. Best effort: if Redis does
        not answer in time, the lease lapses instead."""
        try:
            await asyncio.wait_for(self.queue.deregister_replica(self._capacity.replica_id), timeout_s)
        except Exception as exc:
            logger.warning("could not deregister (%s); the lease will lapse", type(exc).__name__)
