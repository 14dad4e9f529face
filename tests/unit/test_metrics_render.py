"""The fleet exposition merges every source's families with their labels, and adds the queue's gauges."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleet.snapshot import QueueSnapshot
from gateway.metrics import GatewayMetrics
from gateway.metrics_render import render_fleet


def _samples(text: bytes) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


def _key(name: str, **labels: str) -> tuple:
    return name, tuple(sorted(labels.items()))


def test_merges_sources_and_adds_queue_gauges() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.grants.labels("acme", "interactive", "short", "latency").inc()
    second.grants.labels("acme", "interactive", "short", "latency").inc(2)
    first.observe_stream("interactive", 10.0, [10.5, 10.52, 10.6])
    snapshot = QueueSnapshot.model_validate({
        "bands": [{"name": "interactive", "queued": 2, "queued_tokens": 300,
                   "tenants": {"acme": {"queued": 2, "queued_tokens": 300}}}],
        "replicas": [{"replica_id": "r1", "pool": "latency", "slots_total": 4, "slots_free": 1,
                      "tokens_total": 100, "tokens_free": 40}],
        "stats": {"granted": 3, "rejected:queue_full": 1},
    })
    vllm_text = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 3.0\n'
    entries = [({"gateway": "a"}, generate_latest(first.registry).decode()),
               ({"gateway": "b"}, generate_latest(second.registry).decode()),
               ({"replica": "r1", "pool": "latency"}, vllm_text)]
    samples = _samples(render_fleet(entries, snapshot))
    grant = {"band": "interactive", "length_class": "short", "pool": "latency", "tenant": "acme"}
    assert samples[_key("fleetgate_grants_total", gateway="a", **grant)] == 1
    assert samples[_key("fleetgate_grants_total", gateway="b", **grant)] == 2
    assert samples[("fleetgate_time_to_first_token_seconds_count", (("band", "interactive"), ("gateway", "a")))] == 1
    assert samples[("fleetgate_inter_token_latency_seconds_count", (("band", "interactive"), ("gateway", "a")))] == 2
    assert samples[("vllm:num_requests_running", (("model_name", "m"), ("pool", "latency"), ("replica", "r1")))] == 3
    assert samples[("fleetgate_queue_depth", (("band", "interactive"), ("tenant", "acme")))] == 2
    assert samples[("fleetgate_queued_tokens", (("band", "interactive"), ("tenant", "acme")))] == 300
    assert samples[("fleetgate_replica_slots_in_use", (("pool", "latency"), ("replica", "r1")))] == 3
    assert samples[("fleetgate_replica_kv_tokens_reserved", (("pool", "latency"), ("replica", "r1")))] == 60
    assert samples[("fleetgate_queue_events_total", (("event", "rejected_queue_full"),))] == 1
    assert not any(name.endswith("_created") for name, _ in samples)


def test_tenant_labels_can_be_blanked() -> None:
    snapshot = QueueSnapshot.model_validate({"bands": [{"name": "b", "queued": 3, "queued_tokens": 30,
                           "tenants": {"x": {"queued": 1, "queued_tokens": 10},
                                       "y": {"queued": 2, "queued_tokens": 20}}}], "replicas": [], "stats": {}})
    samples = _samples(render_fleet([], snapshot, tenant_labels=False))
    assert samples[("fleetgate_queue_depth", (("band", "b"), ("tenant", "")))] == 3
    assert GatewayMetrics(tenant_labels=False).tenant("acme") == ""


def test_tenant_label_values_are_bounded() -> None:
    metrics = GatewayMetrics(max_tenant_labels=2)
    assert [metrics.tenant(t) for t in ("a", "b", "c", "a", "d", "b")] == ["a", "b", "_other", "a", "_other", "b"]
    assert GatewayMetrics().tenant("z") == "z"  # no limit
    tenants = {name: {"queued": queued, "queued_tokens": 10 * queued} for name, queued in
               [("small", 1), ("big", 5), ("mid", 3), ("tiny", 1)]}
    snapshot = QueueSnapshot.model_validate({"bands": [{"name": "b", "queued": 10, "queued_tokens": 100,
                                                        "tenants": tenants}], "replicas": [], "stats": {}})
    depth = {labels: value for (name, labels), value in _samples(render_fleet([], snapshot, max_tenant_labels=2)).items()
             if name == "fleetgate_queue_depth"}
    assert depth == {(("band", "b"), ("tenant", "big")): 5, (("band", "b"), ("tenant", "mid")): 3,
                     (("band", "b"), ("tenant", "_other")): 2}  # the most waiting keep their labels


def test_the_queue_clock_behind_the_wall_clock_is_exported() -> None:
    snapshot = QueueSnapshot.model_validate({"now_ms": 1_000_000, "wall_ms": 1_012_500, "bands": [], "replicas": [],
                                             "stats": {}})
    assert _samples(render_fleet([], snapshot))[("fleetgate_queue_clock_behind_seconds", ())] == 12.5
