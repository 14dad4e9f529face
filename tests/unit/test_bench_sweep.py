"""The load sweep: loads are multiples of a modelled capacity, every system runs every load, and the report
has the table and one plot per scenario."""

import json
from pathlib import Path

from bench.__main__ import main
from bench.capacity import capacity_rps, offered_rps, rate_scale_for
from bench.workload import Scenario, generate
from replicas.sim_engine import COST_MODELS

SCENARIOS = Path(__file__).resolve().parents[2] / "bench" / "scenarios"


def test_a_load_is_that_multiple_of_the_capacity_and_a_slower_engine_has_less() -> None:
    scenario = Scenario.load(SCENARIOS / "overload.yaml")
    cost = COST_MODELS["cpu-tiny"]
    capacity = capacity_rps(scenario, "cpu-tiny", 2, cost)
    assert capacity_rps(scenario, "cpu-tiny", 2, cost.slowed(2)) < 0.6 * capacity
    twice = generate(scenario, rate_scale_for(2.0, scenario, capacity))
    assert abs(len(twice) / scenario.duration_s / capacity - 2.0) < 0.3  # Poisson arrivals: about 2x
    assert offered_rps(scenario) == len(generate(scenario)) / scenario.duration_s


def test_the_sweep_runs_every_system_at_every_load_and_reports_the_knee(tmp_path: Path) -> None:
    assert main(["sim", "--profile", "cpu-tiny", "--scenarios", str(SCENARIOS / "overload.yaml"),
                 "--systems", "baseline,gateway", "--loads", "0.5,3", "--duration-scale", "0.5",
                 "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "sweep.json").read_text())["scenarios"]["overload"]
    low, high = results["loads"]["0.5"], results["loads"]["3.0"]
    assert set(low["systems"]) == set(high["systems"]) == {"baseline", "gateway"}
    assert 4 < high["requests"] / low["requests"] < 8  # six times the load, give or take Poisson
    baseline = [p["systems"]["baseline"]["interactive_ttft_p99_s"] for p in (low, high)]
    assert baseline[1] > 3 * baseline[0]  # past its knee, the baseline's interactive tail grows
    assert "| 3.0x | gateway |" in (tmp_path / "sweep.md").read_text()
    assert (tmp_path / "overload-sweep.png").stat().st_size < 150_000
