"""A scenario's load relative to what the fleet can do, so a sweep's "1x" means the same on any hardware.

The capacity of a fleet for a scenario's mix is its throughput when it always has work: the discrete-event
simulator (bench/des.py) runs the scenario's requests on the baseline system (Ray Serve's router over vLLM's
defaults), all sent at once, and the capacity is requests / makespan. Load ``L`` is then the rate scale at
which the scenario offers ``L`` times that. It is a model (the calibrated step-cost model of the engines, see
replicas/sim_engine.py), so a live run's knee can sit a little off 1x; the sweep shows where it is.
"""

from __future__ import annotations

from bench.des import simulate
from bench.systems import build_systems
from bench.workload import Scenario, generate
from replicas.sim_engine import StepCostModel


def capacity_rps(scenario: Scenario, profile: str, replicas: int, cost: StepCostModel,
                 context_tokens: int | None = None) -> float:
    """Requests per second the baseline fleet of ``replicas`` finishes of the scenario's mix, always busy."""
    workload = [r.model_copy(update={"send_s": 0.0}) for r in generate(scenario, context_tokens=context_tokens)]
    records = simulate(build_systems(profile, replicas)["baseline"], cost, workload, seed=scenario.seed)
    makespan = max(r.end_s or 0.0 for r in records)
    return len(workload) / makespan


def offered_rps(scenario: Scenario, context_tokens: int | None = None) -> float:
    """Requests per second the scenario sends at rate scale 1."""
    return len(generate(scenario, context_tokens=context_tokens)) / scenario.duration_s


def rate_scale_for(load: float, scenario: Scenario, capacity: float, context_tokens: int | None = None) -> float:
    """The rate scale at which the scenario offers ``load`` times ``capacity``."""
    return load * capacity / offered_rps(scenario, context_tokens)
