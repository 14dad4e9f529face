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
