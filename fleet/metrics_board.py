"""Fleet-wide Prometheus exposition: every process publishes its metrics to Redis; any gateway serves all.

With N gateway replicas behind Ray Serve's proxy, a scrape of ``/metrics`` lands on one of them. So each
gateway replica and each vLLM replica publishes its own registry (as Prometheus text, with the labels that
name it: ``gateway``, or ``replica`` and ``pool``) to Redis every ``publish_interval_s`` under a key that
expires after three intervals; the scraped gateway merges every live source's families and adds the global
queue's gauges (depth and queued tokens per band and tenant, replica capacity in use), read from one
consistent snapshot (``gateway/metrics_render.py``). A dead process's series disappear when its key
expires, as a dead scrape target's do.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import redis.asyncio as aioredis

from fleet.keys import QueueKeys
from fleet.outage_log import OutageLog

logger = logging.getLogger(__name__)


class MetricsBoard:
    """The Redis side: publish one source's exposition, read every live source's."""

    def __init__(self, client: aioredis.Redis, keys: QueueKeys, ttl_s: float) -> None:
        self._client = client
        self._keys = keys
        self._ttl_ms = max(int(ttl_s * 1000), 1000)

    async def publish(self, source: str, labels: dict[str, str], text: str) -> None:
        """Store ``source``'s exposition (with the labels that name it) until it expires."""
        payload = json.dumps({"labels": labels, "text": text})
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.set(self._keys.metrics(source), payload, px=self._ttl_ms)
            pipe.sadd(self._keys.metrics_sources(), source)
            await pipe.execute()

    async def _published(self) -> list[tuple[str, bytes | None]]:
        """(source, payload) of every source ever seen; None where it expired."""
        sources = sorted(s.decode() if isinstance(s, bytes) else s
                         for s in await self._client.smembers(self._keys.metrics_sources()))
        payloads = await self._client.mget([self._keys.metrics(s) for s in sources]) if sources else []
        return list(zip(sources, payloads))

    async def live_sources(self) -> list[str]:
        """The sources whose exposition has not expired."""
        return [source for source, payload in await self._published() if payload is not None]

    async def read(self) -> list[tuple[dict[str, str], str]]:
        """(labels, exposition) of every live source; forgets the expired ones."""
        published = await self._published()
        payloads = [p for _, p in published]
        gone = [s for s, p in published if p is None]
        if gone:
            await self._client.srem(self._keys.metrics_sources(), *gone)
        entries = [json.loads(p) for p in payloads if p is not None]
        return [(entry["labels"], entry["text"]) for entry in entries]


class MetricsPublisher:
    """Publishes one process's registry to the board every interval, in the background."""

    def __init__(self, board: MetricsBoard, source: str, labels: dict[str, str],
                 exposition: Callable[[], bytes], interval_s: float) -> None:
        self._board, self._source, self._labels = board, source, labels
        self._exposition, self._interval_s = exposition, interval_s
        self._task: asyncio.Task | None = None
        self._outage = OutageLog(logger, "metrics publication")

    def start(self) -> None:
        """Start publishing (idempotent; needs a running event loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        """Stop publishing; the published series expire on their own."""
        if self._task is not None:
            self._task.cancel()

    async def publish_now(self) -> None:
        """Publish at once (a scrape calls this for its own gateway, so its series are current)."""
        await self._board.publish(self._source, self._labels, self._exposition().decode())

    async def _run(self) -> None:
        while True:
            try:
                await self.publish_now()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis restarting: the series lapse, then come back
                self._outage.failed(exc)
            else:
                self._outage.succeeded()
            await asyncio.sleep(self._interval_s)
