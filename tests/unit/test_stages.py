"""The gateway's per-stage timing: the histogram and the Server-Timing header agree, lap for lap."""

from __future__ import annotations

import pytest

from gateway.metrics import GatewayMetrics
from gateway.stages import Stages
from tests.support.clock import ManualClock


def test_laps_become_the_server_timing_header_and_the_histogram() -> None:
    clock, metrics = ManualClock(), GatewayMetrics()
    stages = Stages(metrics, clock, start=clock.now)
    clock.now += 0.0004
    stages.lap("parse")
    clock.now += 0.0123
    stages.laps({"enqueue": 0.0111, "wait_grant": 0.0})  # measured by admission, ending now
    clock.now += 0.002
    stages.lap("first_token")

    assert stages.server_timing() == "parse;dur=0.4, enqueue;dur=11.1, wait_grant;dur=0.0, first_token;dur=2.0"
    observed = {sample.labels["stage"]: sample.value for family in metrics.registry.collect()
                for sample in family.samples if sample.name == "fleetgate_request_stage_seconds_sum"}
    expected = {"parse": 0.0004, "enqueue": 0.0111, "wait_grant": 0.0, "first_token": 0.002}
    assert observed.keys() == expected.keys()
    assert all(abs(observed[stage] - seconds) < 1e-9 for stage, seconds in expected.items())


def test_a_clock_that_went_backwards_counts_no_negative_lap() -> None:
    clock = ManualClock()
    stages = Stages(GatewayMetrics(), clock, start=clock.now)
    stages.lap("relay", at=clock.now - 1)
    assert stages.server_timing() == "relay;dur=0.0"


def test_the_bench_probe_reads_the_header_back() -> None:
    from bench.idle_probe import server_timing

    clock = ManualClock()
    stages = Stages(GatewayMetrics(), clock, start=clock.now)
    stages.laps({"enqueue": 0.0019, "wait_grant": 0.25})
    assert server_timing(stages.server_timing()) == {"enqueue": 1.9, "wait_grant": 250.0}
    assert server_timing('cache;desc="hit", total;dur=3') == {"total": 3.0}  # entries without dur: left out


def test_the_wait_for_the_first_token_splits_into_serve_hops_and_the_replicas_parts() -> None:
    from gateway.stages import first_token_parts

    timings = {"grant_check": 0.0006, "render": 0.0031, "engine": 0.0214, "replica": 0.0253}
    parts = first_token_parts(timings, call_s=0.0345)
    assert parts == pytest.approx({"serve_hops": 0.0092, "grant_check": 0.0006, "render": 0.0031, "engine": 0.0214})
    assert first_token_parts(None, 0.03) == {} and first_token_parts({"engine": 0.02}, 0.03) == {}  # times nothing
    assert first_token_parts({"replica": 0.05}, 0.03) == {"serve_hops": 0.0}  # clocks apart: never negative


def test_the_parts_follow_the_laps_in_the_header_and_have_a_histogram_of_their_own() -> None:
    clock, metrics = ManualClock(), GatewayMetrics()
    stages = Stages(metrics, clock, start=clock.now)
    stages.laps({"enqueue": 0.001, "wait_grant": 0.0})
    stages.parts({"serve_hops": 0.009, "engine": 0.0214})
    assert stages.server_timing() == "enqueue;dur=1.0, wait_grant;dur=0.0, serve_hops;dur=9.0, engine;dur=21.4"
    samples = {(sample.name, tuple(sample.labels.values())): sample.value for family in metrics.registry.collect()
               for sample in family.samples if sample.name.endswith("_sum")}
    assert samples[("fleetgate_first_token_part_seconds_sum", ("engine",))] == pytest.approx(0.0214)
    assert ("fleetgate_request_stage_seconds_sum", ("engine",)) not in samples  # not a lap: first_token holds it
