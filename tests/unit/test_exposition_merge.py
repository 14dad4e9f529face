"""The line-by-line merge gives what a full parse and re-render gives: every sample once, with its source's
labels, each family's HELP and TYPE once, ``_created`` gauges dropped, and valid exposition text."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.exposition_merge import merge_expositions
from gateway.metrics import GatewayMetrics

VLLM = '''# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="a \\"quoted\\" {name}, with comma"} 4.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="a \\"quoted\\" {name}, with comma"} 5.0
vllm:request_queue_time_seconds_count{engine="0",model_name="a \\"quoted\\" {name}, with comma"} 5.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="a \\"quoted\\" {name}, with comma"} 1.5
# HELP vllm:request_queue_time_seconds_created Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds_created gauge
vllm:request_queue_time_seconds_created{engine="0",model_name="tiny"} 1.7e9
# TYPE plain_total counter
plain_total 7.0
# TYPE has_pool gauge
has_pool{pool="its own",x="1"} 2.0
'''


def _samples(text: str) -> dict[tuple, float]:
    found: dict[tuple, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in found, key
            found[key] = sample.value
    return found


def _reference(entries: list[tuple[dict[str, str], str]]) -> dict[tuple, float]:
    """What the parser-based merge gave: each sample with the source's labels over its own."""
    merged = {}
    for labels, text in entries:
        for family in text_string_to_metric_families(text):
            if family.type == "gauge" and family.name.endswith("_created"):
                continue
            for sample in family.samples:
                merged[(sample.name, tuple(sorted({**sample.labels, **labels}.items())))] = sample.value
    return merged


def test_the_merge_equals_a_full_parse_and_keeps_each_family_header_once() -> None:
    gateway = GatewayMetrics()
    gateway.grants.labels("acme", "interactive", "short", "latency").inc(3)
    gateway.observe_stream("interactive", 10.0, [10.5, 10.52, 10.6])
    entries = [({"gateway": "g1"}, generate_latest(gateway.registry).decode()),
               ({"replica": "r1", "pool": "latency"}, VLLM),
               ({"replica": 'r"2', "pool": "throughput"}, VLLM)]
    text = merge_expositions(entries)
    assert _samples(text) == _reference(entries)
    assert text.count("# TYPE vllm:request_queue_time_seconds histogram") == 1
    assert text.count("# HELP vllm:num_requests_running ") == 1
    assert "_created" not in text
    assert 'has_pool{replica="r1",pool="latency",x="1"} 2.0' in text  # the source's label wins


def test_skipped_families_and_clashing_types_are_left_out() -> None:
    entries = [({"replica": "a"}, "# TYPE x gauge\nx 1.0\n# TYPE y gauge\ny 2.0\n"),
               ({"replica": "b"}, "# TYPE x counter\nx 3.0\n")]
    text = merge_expositions(entries, skip=frozenset({"y"}))
    assert _samples(text) == {("x", (("replica", "a"),)): 1.0}
    assert merge_expositions([]) == ""
