"""The fleet simulator: nothing is lost, the global queue holds its invariants, and it does what it claims
(strict bands and length-aware pools protect interactive TTFT under overload; fairness under a burst)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.des import FleetSimulation, engine_time, simulate
from bench.metrics import summarise
from bench.systems import PREFIX_AWARE, SYSTEMS, build_systems
from bench.workload import Scenario, generate
from replicas.sim_engine import CPU_TINY_MODEL

SCENARIOS = Path(__file__).parents[2] / "bench" / "scenarios"


@pytest.fixture(scope="module")
def overload() -> Scenario:
    return Scenario.load(SCENARIOS / "overload.yaml")


def test_every_request_ends_once_on_every_system(overload: Scenario) -> None:
    workload = generate(overload, rate_scale=3.0, duration_scale=0.5)
    for name, system in build_systems("cpu-tiny", 2).items():
        records = simulate(system, CPU_TINY_MODEL, workload, seed=1)
        assert len(records) == len(workload), name
        assert all(r.end_s is not None for r in records), name
        served = [r for r in records if r.ok]
        assert all(len(r.token_s) == r.output_tokens for r in served), name


def test_the_global_queue_never_overfills_a_replica_and_returns_every_slot(overload: Scenario) -> None:
    system = build_systems("cpu-tiny", 2)["gateway"]
    sim = FleetSimulation(system, CPU_TINY_MODEL, seed=1)
    most = {}
    original = sim._start

    def watched(replica, request):
        original(replica, request)
        most[replica.replica_id] = max(most.get(replica.replica_id, 0), replica.engine.unfinished)
        assert replica.engine.waiting == 0 or replica.engine.unfinished <= replica.pool.engine.max_num_seqs

    sim._start = watched
    sim.run(generate(overload, rate_scale=3.0, duration_scale=0.5))
    for replica in sim.replicas.values():
        assert most[replica.replica_id] <= replica.pool.engine.max_num_seqs
    assert not sim.scheduler.tickets  # every ticket completed
    assert all(r.slots_free == r.slots_total for r in sim.scheduler.replicas.values())


def test_under_overload_the_gateway_keeps_interactive_ttft_below_the_baseline(overload: Scenario) -> None:
    workload = generate(overload, rate_scale=3.0)
    p99 = {}
    for name in ("baseline", "gateway"):
        records = simulate(build_systems("cpu-tiny", 2)[name], CPU_TINY_MODEL, workload, seed=1)
        p99[name] = summarise(records, overload.slo, 5.0)["bands"]["interactive"]["ttft_p99_s"]
    assert p99["gateway"] < p99["baseline"] / 3, p99


def test_a_burst_does_not_take_the_steady_tenants_share_through_the_gateway() -> None:
    burst = Scenario.load(SCENARIOS / "burst.yaml")
    workload = generate(burst, rate_scale=6.0)  # a backlog in the global queue: 32 grant slots per replica
    steady_p99 = {}
    for name in ("baseline", "gateway"):
        records = simulate(build_systems("cpu-tiny", 2)[name], CPU_TINY_MODEL, workload, seed=1)
        tenants = summarise(records, burst.slo, 5.0)["tenants"]
        steady_p99[name] = max(tenants[t]["ttft_p99_s"] for t in ("steady-a", "steady-b"))
    assert steady_p99["gateway"] < steady_p99["baseline"] / 3, steady_p99


def test_the_simulator_builds_every_system_but_the_live_only_prefix_aware_one() -> None:
    assert tuple(build_systems("gpu-h100-llama3-8b", 16)) == tuple(s for s in SYSTEMS if s != PREFIX_AWARE)


def test_engine_time_accounts_for_every_step_by_the_classes_it_carried(overload: Scenario) -> None:
    workload = generate(overload, rate_scale=3.0, duration_scale=0.5)
    sim = FleetSimulation(build_systems("cpu-tiny", 2)["gateway"], CPU_TINY_MODEL, seed=1)
    spent: dict[str, float] = {}
    original = sim._step

    def timed(replica):  # every step's duration, as the engines ran it
        original(replica)
        if replica.stepping:
            spent[replica.pool.name] = spent.get(replica.pool.name, 0.0) + replica.plan.duration_s

    sim._step = timed
    sim.run(workload)
    pools = engine_time(sim)
    for pool, by_mix in pools.items():
        mixes = {mix: seconds for mix, seconds in by_mix.items() if mix != "replicas"}
        assert set(mixes) <= {"short", "long", "long+short"}
        assert sum(mixes.values()) * by_mix["replicas"] == pytest.approx(spent[pool], abs=0.01)
    # the throughput pool runs long prompts; short ones go to it only when the latency pool is full
    assert pools["throughput"].get("long", 0) > 0
    shorts_only = [r for r in workload if r.prompt_tokens <= 256][:20]  # local.yaml's short: up to 512 tokens
    assert len(shorts_only) == 20
    short_sim = FleetSimulation(build_systems("cpu-tiny", 2)["baseline"], CPU_TINY_MODEL, seed=1)
    short_sim.run(shorts_only)
    assert all(set(by_mix) <= {"replicas", "short"} for by_mix in engine_time(short_sim).values())
