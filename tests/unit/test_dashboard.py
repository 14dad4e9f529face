"""The Grafana dashboard only queries metrics the gateway and vLLM really export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest

from gateway.metrics import GatewayMetrics
from fleet.snapshot import QueueSnapshot
from gateway.metrics_render import queue_families

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "fleetgate-dashboard.json"
VLLM_METRICS = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "vllm:time_to_first_token_seconds_bucket"}  # names from vLLM's PrometheusStatLogger


def _exported() -> set[str]:
    names = set(VLLM_METRICS)
    metrics = GatewayMetrics()
    for family in metrics.registry.collect():
        names |= {f"{family.name}{suffix}" for suffix in ("", "_total", "_bucket", "_count", "_sum")}
    snapshot = QueueSnapshot.model_validate({"now_ms": 0, "bands": [], "replicas": [], "stats": {}})
    names |= {family.name for family in queue_families(snapshot)} | {"fleetgate_queue_events_total"}
    assert generate_latest(metrics.registry)
    return names


def test_every_panel_queries_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = _exported()
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            queried |= set(re.findall(r"\b((?:fleetgate|vllm:)[a-z_:]+)", target["expr"]))
    assert queried and queried <= exported, queried - exported
