"""The summary says, per live run, how the host fared, and marks a starved run as one to draw nothing from."""

from __future__ import annotations

from bench.report import _headroom_table


def test_a_starved_run_is_marked_and_a_healthy_one_is_not() -> None:
    healthy = {"engine_cores": 1.8, "other_cores": 0.15, "idle_cores_min": 0.0, "client_loop_lag_p99_ms": 3.0,
               "gateway_loop_lag_p99_ms": 10.0, "host_starved": False,
               "serve_loop_lag_p99_ms": {"proxy": 10.0, "ingress": 25.0, "engine front ends": 50.0}}
    starved = {**healthy, "gateway_loop_lag_p99_ms": 50.0, "host_starved": True}
    runs = {"baseline": {"headroom": healthy}, "gateway": {"headroom": starved}}
    table = "\n".join(_headroom_table({"systems": runs}))
    baseline, gateway = (line for line in table.splitlines() if line.startswith(("| baseline", "| gateway")))
    assert "starved" not in baseline and "| 1.8 | 0.15 | 0 | 3 | 10 | ≤10 / ≤25 / ≤50 |" in baseline
    assert "host-starved: no conclusion" in gateway
    assert _headroom_table({"systems": {"gateway": {}}}) == []  # the simulator records no headroom
