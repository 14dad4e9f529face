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


def test_a_starved_run_is_explained_by_the_scenarios_busiest_second() -> None:
    from bench.workload import PlannedRequest, busiest_rate

    def sent(at: float) -> PlannedRequest:
        return PlannedRequest(request_id=f"r{at}", tenant="t", weight=1.0, band="b", send_s=at, prompt_tokens=1,
                              output_tokens=1)

    workload = [sent(t / 10) for t in range(10)] + [sent(5 + t / 40) for t in range(30)] + [sent(9.5)]
    assert busiest_rate(workload) == 30  # 30 in [5, 5.75], against 41 over 10 s
    assert busiest_rate([]) == 0
    starved = {"engine_cores": 1.0, "host_starved": True}
    scenario = {"systems": {"gateway": {"headroom": starved}}, "busiest_rps": 30.0, "duration_s": 10.0,
                "requests": 41, "capacity_rps": 10.0}
    why = _headroom_table(scenario)[-1]
    assert why.startswith("Starved: gateway.") and "sent 30 requests, 7.3x its average rate and 3.0x" in why
    healthy = {**scenario, "systems": {"gateway": {"headroom": {**starved, "host_starved": False}}}}
    assert not _headroom_table(healthy)[-1].startswith("Starved")
