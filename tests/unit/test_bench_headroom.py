"""Host headroom: the gateways' loop-lag P99 between two scrapes, and the starved verdict."""

from __future__ import annotations

import subprocess
import sys

from bench.headroom import CpuSampler, histogram_p99, lag_histogram, verdict

SCRAPE = """# TYPE fleetgate_event_loop_lag_seconds histogram
fleetgate_event_loop_lag_seconds_bucket{gateway="a",le="0.005"} %d
fleetgate_event_loop_lag_seconds_bucket{gateway="a",le="0.02"} %d
fleetgate_event_loop_lag_seconds_bucket{gateway="a",le="0.05"} %d
fleetgate_event_loop_lag_seconds_bucket{gateway="a",le="+Inf"} %d
fleetgate_event_loop_lag_seconds_count{gateway="a"} %d
fleetgate_event_loop_lag_seconds_sum{gateway="a"} 1.0
"""


def test_the_p99_is_taken_from_what_happened_between_the_scrapes() -> None:
    before = lag_histogram(SCRAPE % (1000, 1000, 1000, 1000, 1000))  # a quiet past
    after = lag_histogram(SCRAPE % (1090, 1097, 1100, 1100, 1100))   # then 100 samples, 3 of them > 20 ms
    assert histogram_p99(before, after) == 0.05
    assert histogram_p99({}, lag_histogram(SCRAPE % (100, 100, 100, 100, 100))) == 0.005
    assert histogram_p99(after, after) is None


def test_a_scenario_is_starved_when_either_loop_lags_past_20_ms() -> None:
    assert not verdict(0.004, 0.02) and not verdict(None, None)
    assert verdict(0.03, None) and verdict(0.001, 0.05)


def test_the_cpu_sampler_counts_an_engine_process_apart_from_the_rest() -> None:
    busy = "import time\nend = time.monotonic() + 1.5  # headroom-test-engine\nwhile time.monotonic() < end: pass"
    engine = subprocess.Popen([sys.executable, "-c", busy])
    try:
        with CpuSampler(lambda comm, cmdline: "headroom-test-engine" in cmdline, period_s=0.2) as cpu:
            engine.wait()
    finally:
        engine.kill()
    summary = cpu.summary()
    assert summary["engine_cores"] >= 0.4, summary  # one busy core, less its start-up (generous: shared CI)


def _serve_line(labels: str, le: str, count: int) -> str:
    return f'ray_serve_event_loop_scheduling_latency_ms_bucket{{Component="core_worker",{labels},le="{le}"}} {count}'


def _serve_scrape(ingress: tuple[int, ...], proxy: tuple[int, ...], front: tuple[int, ...]) -> str:
    """Ray's export as it reads (its label set cut down): buckets 10, 25, 50 ms, +Inf."""
    parts = {'component="proxy",deployment="",loop_type="main"': proxy,
             'component="replica",deployment="OpenAiIngress",loop_type="user_code"': ingress,
             'component="replica",deployment="LLMServer:tiny-llama",loop_type="main"': front,
             'component="replica",deployment="",loop_type="router"': (7, 7, 7, 7)}  # no process named: left out
    lines = ["# TYPE ray_serve_event_loop_scheduling_latency_ms histogram"]
    for labels, counts in parts.items():
        lines += [_serve_line(labels, le, c) for le, c in zip(("10.0", "25.0", "50.0", "+Inf"), counts)]
    return "\n".join(lines) + "\n"


def test_ray_serves_own_loop_lag_flags_a_starved_proxy_or_ingress_for_any_system() -> None:
    from bench.headroom import serve_lag_histograms, serve_lag_p99s, serve_starved

    before = serve_lag_histograms(_serve_scrape((0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0)))
    quiet = serve_lag_histograms(_serve_scrape((1000, 1000, 1000, 1000), (500, 500, 500, 500), (90, 95, 100, 100)))
    p99s = serve_lag_p99s(before, quiet)
    assert p99s == {"proxy": 0.01, "ingress": 0.01, "engine front ends": 0.05}
    assert not serve_starved(p99s)  # engine front ends inform, they do not flag
    late_ingress = serve_lag_histograms(_serve_scrape((950, 980, 1000, 1000), (500, 500, 500, 500), (0, 0, 0, 0)))
    assert serve_lag_p99s(before, late_ingress)["ingress"] == 0.05 and serve_starved(serve_lag_p99s(before, late_ingress))
    assert serve_lag_p99s(quiet, quiet) == {"proxy": None, "ingress": None, "engine front ends": None}
    assert not serve_starved({})  # no Ray metrics: the other checks decide
