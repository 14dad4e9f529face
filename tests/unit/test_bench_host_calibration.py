"""A live run's load is set from this host's calibrated step times (bench/host_calibration.py), cached per
host, and each scenario runs at its ``offered_load`` times the capacity they give (bench/__main__.py)."""

import argparse
import json
from pathlib import Path

import pytest

from bench import __main__ as bench_main
from bench import host_calibration
from bench.capacity import offered_rps
from bench.host_calibration import host_cost_model
from bench.workload import Scenario
from replicas.sim_engine import CPU_BENCH_MODEL

SCENARIOS = Path(__file__).resolve().parents[2] / "bench" / "scenarios"


def _fit(cost) -> dict:
    return {"fit": {name: getattr(cost, name) for name in ("base_s", "per_token_s", "per_seq_s", "per_attention_s")}}


def test_a_cached_calibration_is_read_and_a_new_host_is_measured(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(host_calibration, "host_key", lambda model: "host-a")
    (tmp_path / "bench-host-a.json").write_text(json.dumps(_fit(CPU_BENCH_MODEL)))
    cost = host_cost_model("bench", 1, cache=tmp_path)
    assert cost.per_token_s == CPU_BENCH_MODEL.per_token_s and "on this host" in cost.source

    runs = []
    monkeypatch.setattr(host_calibration, "host_key", lambda model: "host-b")

    def calibrate(command, **_):  # stands in for `python -m bench.calibrate` on a host 3x slower
        runs.append(command)
        Path(command[command.index("--out") + 1]).write_text(json.dumps(_fit(CPU_BENCH_MODEL.slowed(3))))
        return argparse.Namespace(returncode=0, stderr="")

    monkeypatch.setattr(host_calibration.subprocess, "run", calibrate)
    slower = host_cost_model("bench", 1, cache=tmp_path)
    assert slower.per_token_s == pytest.approx(3 * CPU_BENCH_MODEL.per_token_s)
    host_cost_model("bench", 1, cache=tmp_path)
    assert len(runs) == 1 and runs[0][2:6] == ["bench.calibrate", "--model", "bench", "--core"]  # then cached


def test_the_host_key_changes_with_the_cpu(monkeypatch) -> None:
    monkeypatch.setattr(host_calibration, "cpu_flags", lambda: frozenset({"avx2"}))
    avx2 = host_calibration.host_key("bench")
    monkeypatch.setattr(host_calibration, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "amx_bf16"}))
    assert host_calibration.host_key("bench") != avx2


def _live_args(**given) -> argparse.Namespace:
    args = dict(mode="live", simulated=None, model="bench", engine_cores="1", rate_scale=None, replicas=2)
    return argparse.Namespace(**{**args, **given})


def test_a_live_scenario_runs_at_its_offered_load_of_this_hosts_capacity() -> None:
    scenario = Scenario.load(SCENARIOS / "overload.yaml")
    fast = bench_main._offered(_live_args(host_cost=CPU_BENCH_MODEL), scenario, 1.0, 1024)
    slow = bench_main._offered(_live_args(host_cost=CPU_BENCH_MODEL.slowed(3)), scenario, 1.0, 1024)
    assert fast["load"] == slow["load"] == scenario.offered_load == 2.0
    for offered in (fast, slow):  # offered = load x capacity, whatever the host's speed
        assert offered_rps(scenario, 1024) * offered["rate_scale"] == pytest.approx(2.0 * offered["capacity_rps"],
                                                                                   rel=0.01)
    assert slow["capacity_rps"] < 0.5 * fast["capacity_rps"]
    assert "calibrated on this host" in fast["capacity_model"]


def test_a_given_rate_scale_or_a_simulation_keeps_the_written_rates() -> None:
    scenario = Scenario.load(SCENARIOS / "overload.yaml")
    assert bench_main._offered(_live_args(rate_scale=0.5, host_cost=CPU_BENCH_MODEL), scenario, 0.5, None) == {
        "rate_scale": 0.5}
    assert bench_main._offered(_live_args(mode="sim"), scenario, 1.0, None) == {"rate_scale": 1.0}
