"""Request headers, request ids, length classes, band resolution and pool-preferring placement (pure)."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidHeader
from gateway.headers import read_headers, read_tenant_id, request_id_of
from policies.classification import LengthClasses, estimate_batch_cost, estimate_cost
from policies.gate import open_replicas
from policies.placement import choose_replica, guarded_classes, pool_for_class
from policies.priority import BandNotAllowed, resolve_band
from policies.types import BandPolicy, ReplicaCapacity

BANDS = ["interactive", "standard", "batch"]
OBJECTIVES = {"chat": "interactive", "offline": "batch"}


def test_priority_objective_alias_fairness_id_and_slo() -> None:
    asked = read_headers({"x-gateway-inference-objective": "chat", "x-gateway-inference-fairness-id": "user:42",
                          "x-slo-ttft-ms": "1500"}, BANDS, OBJECTIVES)
    assert (asked.band, asked.flow, asked.ttft_slo_s) == ("interactive", "user:42", 1.5)
    both = read_headers({"x-priority": "batch", "x-gateway-inference-objective": "chat"}, BANDS, OBJECTIVES)
    assert both.band == "batch"  # x-priority wins
    assert read_headers({}, BANDS, OBJECTIVES).band is None
    assert read_headers({"x-priority": " Batch "}, BANDS, OBJECTIVES).band == "batch"  # names are lowercase


@pytest.mark.parametrize(("headers", "param"), [
    ({"x-priority": "urgent"}, "x-priority"),
    ({"x-gateway-inference-objective": "nope"}, "x-gateway-inference-objective"),
    ({"x-gateway-inference-fairness-id": "a|b"}, "x-gateway-inference-fairness-id"),
    ({"x-gateway-inference-fairness-id": "x" * 129}, "x-gateway-inference-fairness-id"),
    ({"x-slo-ttft-ms": "soon"}, "x-slo-ttft-ms"),
    ({"x-slo-ttft-ms": "-5"}, "x-slo-ttft-ms"),
    ({"x-slo-ttft-ms": "0"}, "x-slo-ttft-ms"),
])
def test_bad_header_values_are_400_naming_the_header(headers: dict, param: str) -> None:
    with pytest.raises(InvalidHeader) as caught:
        read_headers(headers, BANDS, OBJECTIVES)
    assert caught.value.status == 400 and caught.value.param == param


def test_tenant_header_is_validated() -> None:
    assert read_tenant_id({"x-tenant-id": "team-7"}) == "team-7"
    with pytest.raises(InvalidHeader):
        read_tenant_id({"x-tenant-id": "a|b"})


def test_request_id_for_logs_is_the_proxys_made_safe() -> None:
    assert request_id_of({"x-request-id": "req-123_abc"}) == "req-123_abc"
    assert request_id_of({"x-request-id": "forged\nline here"}) == "forged?line?here"
    assert len(request_id_of({"x-request-id": "x" * 500})) == 128
    assert len(request_id_of({})) == 32


def test_length_classes_from_configured_bounds() -> None:
    classes = LengthClasses.from_bounds([("tiny", 16), ("short", 512), ("long", None)])
    assert [classes.classify(n) for n in (1, 16, 17, 512, 513, 10**6)] == ["tiny", "tiny", "short", "short",
                                                                             "long", "long"]
    for bad in ([("a", 10)], [("a", 10), ("b", 5), ("c", None)], [("a", None), ("b", None)]):
        with pytest.raises(ValueError):
            LengthClasses.from_bounds(bad)


def test_cost_is_prompt_plus_bounded_output() -> None:
    assert estimate_cost(100, 20, 256, 4096) == 120
    assert estimate_cost(100, None, 256, 4096) == 356
    assert estimate_cost(4000, None, 256, 4096) == 4096  # never beyond the context
    assert estimate_cost(100, 20, 256, 4096, sequences=4) == 180  # n (or the beam width): 4 outputs
    assert estimate_batch_cost([100, 300], 20, 256, 4096, sequences=2) == 100 + 40 + 300 + 40  # every prompt


def test_resolve_band() -> None:
    assert resolve_band(None, BANDS, "standard").band == "standard"
    assert resolve_band("interactive", BANDS, "standard", ceiling="standard").band == "standard"
    assert resolve_band(None, BANDS, "interactive", ceiling="batch").band == "batch"
    with pytest.raises(BandNotAllowed):
        resolve_band("standard", BANDS, "batch", ceiling="batch", over_allowance="reject")


def test_long_prompts_go_to_the_preferring_pool_and_short_ones_spill_over() -> None:
    latency = ReplicaCapacity("lat", 2, 10_000, accepts=frozenset({"short"}), prefers=frozenset({"short"}),
                              pool="latency")
    throughput = ReplicaCapacity("thr", 4, 10_000, accepts=frozenset({"short", "long"}),
                                 prefers=frozenset({"long"}), pool="throughput")
    replicas = [latency, throughput]

    def place(cost: int, length_class: str) -> ReplicaCapacity | None:  # gate, then filter -> scorer -> picker
        return choose_replica(open_replicas(replicas, BandPolicy("standard")), cost, length_class)

    assert place(100, "short") is latency  # preferred, though the other has more free slots
    assert place(3000, "long") is throughput
    latency.slots_free = 0
    assert place(100, "short") is throughput  # spill-over onto free capacity
    throughput.slots_free = 0
    assert place(3000, "long") is None  # never onto a pool that does not accept it


def test_a_pool_takes_classes_longer_than_it_is_built_for_only_when_idle() -> None:
    assert guarded_classes(["short", "long"], ["short"], ["short", "long"]) == {"long"}
    assert guarded_classes(["short", "long"], ["long"], ["short", "long"]) == set()  # shorter: not guarded
    assert guarded_classes(["short", "long"], [], ["short", "long"]) == set()
    latency = ReplicaCapacity("lat", 4, 10_000, accepts=frozenset({"short", "long"}), prefers=frozenset({"short"}),
                              guarded=frozenset({"long"}), pool="latency")
    band = BandPolicy("standard")
    assert choose_replica(open_replicas([latency], band), 3000, "long") is latency  # idle: it may
    latency.slots_free, latency.tokens_free = 3, 7_000  # one grant held (stale signals: its reserve is pending)
    assert choose_replica(open_replicas([latency], band), 3000, "long") is None
    assert choose_replica(open_replicas([latency], band), 100, "short") is latency


def test_without_the_queue_each_class_goes_to_its_preferred_pool() -> None:
    pools = [("latency", ["short"], ["short"]), ("throughput", ["short", "long"], ["long"])]
    assert pool_for_class(pools, "short") == "latency" and pool_for_class(pools, "long") == "throughput"
    assert pool_for_class([("only", ["short", "long"], [])], "long") == "only"
    with pytest.raises(ValueError):
        pool_for_class([("latency", ["short"], ["short"])], "long")
