"""Fleet-wide Prometheus exposition: every process publishes its metrics to Redis; any gateway serves all.

With N gateway replicas behind Ray Serve's proxy, a scrape of ``/metrics`` lands on one of them. So each
gateway replica and each vLLM replica publishes its own registry (as Prometheus text, with the labels that
name it: ``gateway``, or ``replica`` and ``pool``) to Redis every ``publish_interval_s`` under a key that
expires after three intervals; the scraped gateway merges every live source's families and adds the global
queue's gauges (depth and queued tokens per band and tenant, replica capacity in use), read from one
consistent snapshot. A dead process's series disappear when its key expires, as a dead scrape target's do.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.queue.keys import QueueKeys
from gateway.queue.redis_queue import lua_mapping

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

    async def read(self) -> list[tuple[dict[str, str], str]]:
        """(labels, exposition) of every live source; forgets the expired ones."""
        sources = sorted(s.decode() if isinstance(s, bytes) else s
                         for s in await self._client.smembers(self._keys.metrics_sources()))
        if not sources:
            return []
        payloads = await self._client.mget([self._keys.metrics(s) for s in sources])
        gone = [s for s, p in zip(sources, payloads) if p is None]
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
                logger.warning("metrics publication failed: %s", type(exc).__name__)
            await asyncio.sleep(self._interval_s)


def render_fleet(entries: Iterable[tuple[dict[str, str], str]], snapshot: dict[str, Any] | None,
                 tenant_labels: bool = True) -> bytes:
    """One Prometheus exposition: every source's families merged, plus the global queue's gauges."""
    families: dict[str, Metric] = {}
    for labels, text in entries:
        for family in text_string_to_metric_families(text):
            if family.type == "gauge" and family.name.endswith("_created"):
                continue
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            if merged.type != family.type:
                continue
            for sample in family.samples:
                merged.add_sample(sample.name, {**sample.labels, **labels}, sample.value)
    if snapshot is not None:
        for family in queue_families(snapshot, tenant_labels):
            families[family.name] = family
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


def queue_families(snapshot: dict[str, Any], tenant_labels: bool = True) -> list[Metric]:
    """The global queue's state as gauges: per band and tenant, per replica, and its event totals."""
    depth = GaugeMetricFamily("fleetgate_queue_depth", "Tickets waiting in the global queue.", labels=["band", "tenant"])
    tokens = GaugeMetricFamily("fleetgate_queued_tokens", "Estimated tokens of the waiting tickets.",
                               labels=["band", "tenant"])
    band_depth = GaugeMetricFamily("fleetgate_band_queue_depth", "Tickets waiting, per band.", labels=["band"])
    for band in snapshot.get("bands") or []:
        band_depth.add_metric([band["name"]], band["queued"])
        per_tenant: dict[str, list[int]] = {}
        for tenant, waiting in lua_mapping(band.get("tenants")).items():
            total = per_tenant.setdefault(tenant if tenant_labels else "", [0, 0])
            total[0] += waiting["queued"]
            total[1] += waiting["queued_tokens"]
        for tenant, (count, queued_tokens) in sorted(per_tenant.items()):
            depth.add_metric([band["name"], tenant], count)
            tokens.add_metric([band["name"], tenant], queued_tokens)
    replica_gauges = {
        name: GaugeMetricFamily(f"fleetgate_replica_{name}", doc, labels=["replica", "pool"])
        for name, doc in (("slots", "Sequences the replica registered (its max_num_seqs)."),
                          ("slots_in_use", "Slots held by granted requests."),
                          ("kv_tokens", "KV-cache tokens the replica registered."),
                          ("kv_tokens_reserved", "KV-cache tokens reserved by granted requests."))
    }
    for replica in snapshot.get("replicas") or []:
        key = [replica["replica_id"], replica.get("pool") or ""]
        replica_gauges["slots"].add_metric(key, replica["slots_total"])
        replica_gauges["slots_in_use"].add_metric(key, replica["slots_total"] - replica["slots_free"])
        replica_gauges["kv_tokens"].add_metric(key, replica["tokens_total"])
        replica_gauges["kv_tokens_reserved"].add_metric(key, replica["tokens_total"] - replica["tokens_free"])
    events = Metric("fleetgate_queue_events", "Global queue events since the queue began (all gateways).", "counter")
    for event, count in sorted(lua_mapping(snapshot.get("stats")).items()):
        events.add_sample("fleetgate_queue_events_total", {"event": event.replace(":", "_")}, count)
    return [depth, tokens, band_depth, *replica_gauges.values(), events]



class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families
