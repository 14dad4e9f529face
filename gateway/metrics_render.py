"""``GET /metrics`` for the whole fleet: every published source's families merged, plus the queue's gauges."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from fleet.snapshot import QueueSnapshot
from gateway.exposition_merge import merge_expositions
from gateway.metrics import OTHER_TENANTS


def render_fleet(entries: Iterable[tuple[dict[str, str], str]], snapshot: QueueSnapshot | None,
                 tenant_labels: bool = True, max_tenant_labels: int = 0) -> bytes:
    """One Prometheus exposition: every source's families merged, plus the global queue's gauges (which
    replace any source's family of the same name)."""
    queue = queue_families(snapshot, tenant_labels, max_tenant_labels) if snapshot is not None else []
    merged = merge_expositions(entries, skip=frozenset(family.name for family in queue))
    if not queue:
        return merged.encode()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(queue))
    return merged.encode() + generate_latest(registry)


def _band_families(snapshot: QueueSnapshot, tenant_labels: bool, max_tenant_labels: int) -> list[Metric]:
    """What waits in each band, in all and per tenant (one unlabelled total when tenant labels are off; past
    ``max_tenant_labels`` tenants in a band, those with the least waiting summed as :data:`OTHER_TENANTS`)."""
    depth = GaugeMetricFamily("fleetgate_queue_depth", "Tickets waiting in the global queue.", labels=["band", "tenant"])
    tokens = GaugeMetricFamily("fleetgate_queued_tokens", "Estimated tokens of the waiting tickets.",
                               labels=["band", "tenant"])
    band_depth = GaugeMetricFamily("fleetgate_band_queue_depth", "Tickets waiting, per band.", labels=["band"])
    for band in snapshot.bands:
        band_depth.add_metric([band.name], band.queued)
        per_tenant: dict[str, list[int]] = {}
        labelled = _most_waiting(band.tenants, max_tenant_labels) if tenant_labels else set()
        for tenant, waiting in band.tenants.items():
            label = (tenant if tenant in labelled else OTHER_TENANTS) if tenant_labels else ""
            total = per_tenant.setdefault(label, [0, 0])
            total[0] += waiting.queued
            total[1] += waiting.queued_tokens
        for tenant, (count, queued_tokens) in sorted(per_tenant.items()):
            depth.add_metric([band.name, tenant], count)
            tokens.add_metric([band.name, tenant], queued_tokens)
    return [depth, tokens, band_depth]


def _most_waiting(tenants: dict[str, Any], limit: int) -> set[str]:
    if not limit or len(tenants) <= limit:
        return set(tenants)
    ranked = sorted(tenants, key=lambda tenant: (-tenants[tenant].queued, tenant))
    return set(ranked[:limit])


def queue_families(snapshot: QueueSnapshot, tenant_labels: bool = True, max_tenant_labels: int = 0) -> list[Metric]:
    """The global queue's state as gauges: per band and tenant, per replica, and its event totals."""
    replica_gauges = {
        name: GaugeMetricFamily(f"fleetgate_replica_{name}", doc, labels=["replica", "pool"])
        for name, doc in (("slots", "Sequences the replica registered (its max_num_seqs)."),
                          ("slots_in_use", "Slots held by granted requests."),
                          ("kv_tokens", "KV-cache tokens the replica registered."),
                          ("kv_tokens_reserved", "KV-cache tokens reserved by granted requests."))
    }
    signals = {
        name: GaugeMetricFamily(f"fleetgate_replica_{name}", doc, labels=["replica", "pool"])
        for name, doc in (("pending_tokens", "What the gate counts: prompt tokens not started (reported + in flight; "
                                             "with stale signals, the tokens its grants reserve)."),
                          ("gate_limit_tokens", "The top band's pending limit on this replica (max_unstarted_steps "
                                                "x its step budget)."),
                          ("unstarted", "Requests the replica reported not started (in transit, waiting, prefilling)."),
                          ("in_flight", "Grants made to the replica that it has not acknowledged yet."),
                          ("guarded_held", "Grants it holds of classes longer than its pool is built for (long "
                                           "prompts on a latency replica: short work then goes elsewhere first)."),
                          ("engine_running", "Running requests its engine last reported."),
                          ("engine_waiting", "Waiting requests its engine last reported."),
                          ("engine_kv_usage", "KV-cache usage its engine last reported (0-1)."),
                          ("signals_fresh", "1 while its engine signals are current, 0 when stale (concurrency cap)."),
                          ("signal_age_seconds", "Time since its last engine report."))
    }
    gate_open = GaugeMetricFamily("fleetgate_replica_gate_open", "1 when the gate lets the band's tickets onto the "
                                  "replica now, 0 when it is closed to them.", labels=["replica", "pool", "band"])
    top = snapshot.bands[0] if snapshot.bands else None
    for replica in snapshot.replicas:
        key = [replica.replica_id, replica.pool]
        replica_gauges["slots"].add_metric(key, replica.slots_total)
        replica_gauges["slots_in_use"].add_metric(key, replica.slots_total - replica.slots_free)
        replica_gauges["kv_tokens"].add_metric(key, replica.tokens_total)
        replica_gauges["kv_tokens_reserved"].add_metric(key, replica.tokens_total - replica.tokens_free)
        values = {"pending_tokens": replica.pending, "unstarted": replica.unstarted, "in_flight": replica.in_flight,
                  "guarded_held": replica.guarded_held,
                  "engine_running": replica.running, "engine_waiting": replica.waiting,
                  "engine_kv_usage": replica.kv_usage, "signals_fresh": int(replica.fresh),
                  "gate_limit_tokens": top.max_unstarted_steps * replica.step_tokens if top else 0,
                  "signal_age_seconds": max(0, snapshot.now_ms - replica.signals_at_ms) / 1000
                  if replica.signals_at_ms else float("nan")}
        for name, value in values.items():
            signals[name].add_metric(key, value)
        for band in snapshot.bands:
            gate_open.add_metric(key + [band.name], int(band.name in replica.open_bands))
    clock_behind = GaugeMetricFamily("fleetgate_queue_clock_behind_seconds", "How far the queue's clock runs behind "
                                     "the Redis server's wall clock: what it cut from wall-clock jumps (a paused VM, an "
                                     "NTP step), so that no live lease lapsed. It grows only at a jump.")
    if snapshot.wall_ms:
        clock_behind.add_metric([], snapshot.clock_behind_s)
    events = Metric("fleetgate_queue_events", "Global queue events since the queue began (all gateways).", "counter")
    for event, count in sorted(snapshot.stats.items()):
        events.add_sample("fleetgate_queue_events_total", {"event": event.replace(":", "_")}, count)
    return [*_band_families(snapshot, tenant_labels, max_tenant_labels), *replica_gauges.values(), *signals.values(),
            gate_open, clock_behind, events]



class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families
