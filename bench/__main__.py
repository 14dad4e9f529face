"""``python -m bench``: run the scenarios against the systems (bench/systems.py) and write the report.

    python -m bench sim  [--profile cpu-tiny|gpu-h100-llama3-8b] [--replicas N] [--rate-scale X] ...
    python -m bench live [--systems baseline,...] ...        (real vLLM behind `serve run`, this machine)
    python -m bench soak [--minutes 20] ...                  (faults under mixed load, then the ledger)

Both run every scenario on every system back to back from the same seeded workload (fresh prompts), plus
reference runs without the tenants a scenario names (``reference_without``), and write results.json,
summary.md and PNG plots into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from bench import sweep
from bench.capacity import rate_scale_for
from bench.host_calibration import host_cost_model
from bench.metrics import RequestRecord, summarise, write_records
from bench.sweep import LIVE_PROFILES
from bench.systems import SYSTEMS, systems_for
from bench.workload import PlannedRequest, Scenario, busiest_rate, generate

SCENARIOS = Path(__file__).parent / "scenarios"
REFERENCE_SYSTEMS = ("baseline", "gateway")
BENCH_MODEL_CONTEXT = 1024  # live runs of the bench model: prompts are fractions of this


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    for mode in ("sim", "live"):
        p = sub.add_parser(mode)
        p.add_argument("--scenarios", nargs="+", default=sorted(str(s) for s in SCENARIOS.glob("*.yaml")))
        p.add_argument("--systems", default=",".join(SYSTEMS))
        p.add_argument("--rate-scale", type=float, default=None,
                       help="multiply every arrival rate (live, by default: each scenario at its `offered_load` times the "
                            "fleet's capacity on this host)")
        p.add_argument("--duration-scale", type=float, default=1.0, help="stretch every scenario")
        p.add_argument("--out", type=Path, default=Path(f"bench/results/{mode}"))
        p.add_argument("--no-references", action="store_true", help="skip the runs without the named tenants")
        p.add_argument("--records", action="store_true",
                       help="also write every request's record, one JSON line each, to "
                            "<out>/records/<scenario>--<system>.jsonl (per-request analysis; keep them out of the repo)")
        p.add_argument("--loads", default=None,
                       help="a load sweep instead: offered loads as multiples of capacity, e.g. 0.5,1,2,3 "
                            "(bench/sweep.py)")
    sim = sub.choices["sim"]
    sim.add_argument("--profile", default="cpu-tiny", help="cpu-tiny or gpu-h100-llama3-8b")
    sim.add_argument("--replicas", type=int, default=2)
    sim.add_argument("--context-tokens", type=int, default=None, help="model context (default: the scenario's)")
    sim.add_argument("--slowdown", type=float, default=1.0,
                     help="engine steps this many times the profile's (2: two engines sharing one core, as the "
                          "live CPU runs do)")
    sim.add_argument("--queue-overhead-ms", type=float, default=None, help="per-grant overhead (default: measured)")
    live = sub.choices["live"]
    live.add_argument("--config", type=Path, default=Path("deploy/local.yaml"))
    live.add_argument("--max-in-flight", type=int, default=512, help="client connection cap")
    live.add_argument("--model", default="bench",
                      help="bench: engine-bound (tens of ms a step); tiny: the tests' model (host-bound); or a "
                           "model folder (bench/gpu.sh)")
    live.add_argument("--baseline-config", type=Path, default=Path("bench/deploy/ray-serve-llm.yaml"),
                      help="the Ray Serve LLM baselines' config (bench/deploy/ray-serve-llm-gpu.yaml on GPUs)")
    live.add_argument("--context-tokens", type=int, default=None,
                      help=f"model context (default: the scenario's; {BENCH_MODEL_CONTEXT} for the bench model, whose "
                           "prefill is slow enough that a 30 s scenario at 4096 holds too few requests for a P99)")
    live.add_argument("--engine-cores", default="auto",
                      help="cores every system's vLLM engine processes are confined to, everything else to the "
                           "others, e.g. '1' ('auto': on a host of 4 cores or fewer, the last one, else the "
                           "configs' own binding; 'config': the configs' own). See bench/README.md")
    live.add_argument("--simulated", default=None, help="run the gateway on simulated replicas of this profile")
    live.add_argument("--replicas", type=int, default=16, help="with --simulated: replicas in the fleet")
    live.add_argument("--time-scale", type=float, default=1.0,
                      help="with --simulated: engine steps this many times slower (and the load that much "
                           "sparser and longer), so the fleet is engine-bound at a rate this host can drive")
    return parser.parse_args(argv)


def _runs(scenario: Scenario, systems: list[str], references: bool, real_engines: bool
          ) -> list[tuple[str, str, list[str]]]:
    """(label, system, tenants left out) for one scenario."""
    systems = systems_for(scenario.shares_prefixes, systems, real_engines)
    runs = [(system, system, []) for system in systems]
    if references and scenario.reference_without:
        without = scenario.reference_without
        runs += [(f"{system} without {'+'.join(without)}", system, without)
                 for system in REFERENCE_SYSTEMS if system in systems]
    return runs


def ratios(results: dict[str, Any]) -> list[str]:
    """The headline ratios the issue asks for, from whatever runs are present."""
    lines = []

    def figure(scenario: str, system: str, band: str | None, key: str) -> float | None:
        summary = results["scenarios"].get(scenario, {}).get("systems", {}).get(system)
        if summary is None:
            return None
        group = summary["overall"] if band is None else summary["bands"].get(band)
        return None if group is None else group.get(key)

    for system in REFERENCE_SYSTEMS:
        loaded = figure("overload", system, "interactive", "ttft_p99_s")
        alone = figure("overload", f"{system} without bulk", "interactive", "ttft_p99_s")
        if loaded and alone:
            lines.append(f"overload, {system}: interactive P99 TTFT {loaded:.3f} s vs {alone:.3f} s without the "
                         f"batch tenant = {loaded / alone:.1f}x")
        for key, what in (("itl_p99_s", "P99 inter-token gap"), ("stall_p99_s", "P99 worst gap per stream")):
            loaded = figure("long-prompts", system, "interactive", key)
            alone = figure("long-prompts", f"{system} without documents", "interactive", key)
            if loaded and alone:
                lines.append(f"long-prompts, {system}: {what} of the streams {loaded * 1000:.1f} ms vs "
                             f"{alone * 1000:.1f} ms without the long prompts = {loaded / alone:.2f}x")
    base, ours = figure("overload", "baseline", "interactive", "ttft_p99_s"), figure(
        "overload", "gateway", "interactive", "ttft_p99_s")
    if base and ours:
        lines.append(f"overload: interactive P99 TTFT baseline / gateway = {base / ours:.1f}x")
    for key, what in (("itl_p99_s", "P99 inter-token gap"), ("stall_p99_s", "P99 worst gap per stream")):
        base, ours = figure("long-prompts", "baseline", "interactive", key), figure(
            "long-prompts", "gateway", "interactive", key)
        if base and ours:
            lines.append(f"long-prompts: streams' {what} baseline / gateway = {base / ours:.1f}x")
    base, ours = figure("overload", "baseline", "batch", "ttft_p99_s"), figure("overload", "gateway", "batch", "ttft_p99_s")
    if base and ours:
        lines.append(f"overload: batch P99 TTFT gateway / baseline = {ours:.1f} s / {base:.1f} s = {ours / base:.2f}x")
    for system in SYSTEMS:
        fair = results["scenarios"].get("burst", {}).get("systems", {}).get(system, {}).get("fairness")
        steady = _tenants_p99(results, "burst", system, ("steady-a", "steady-b"))
        if fair and steady is not None:
            jain = "–" if fair["jain_min"] is None else f"{fair['jain_min']:.2f}"
            least = "–" if fair.get("fair_share_min") is None else f"{fair['fair_share_min']:.2f}"
            lines.append(f"burst, {system}: steady tenants' P99 TTFT {steady:.2f} s; Jain min {jain} against fair "
                         f"shares over {fair['windows_compared']} backlogged windows, least fair share {least}")
    base = _tenants_p99(results, "burst", "baseline", ("steady-a", "steady-b"))
    ours = _tenants_p99(results, "burst", "gateway", ("steady-a", "steady-b"))
    if base and ours:
        lines.append(f"burst: steady tenants' P99 TTFT gateway / baseline = {ours / base:.2f}")
    for system in SYSTEMS:  # where prompts share prefixes: what each router's placement makes of the cache
        p50, p99 = (figure("shared-prefixes", system, "interactive", key)
                    for key in ("ttft_p50_s", "ttft_p99_s"))
        docs = figure("shared-prefixes", system, "standard", "ttft_p99_s")
        if p50 is not None and p99 is not None and docs is not None:
            lines.append(f"shared-prefixes, {system}: interactive TTFT P50 {p50:.3f} s, P99 {p99:.3f} s; "
                         f"standard P99 {docs:.3f} s")
    base, ours = (figure("steady", "baseline", "interactive", "ttft_p50_s"),
                  figure("steady", "gateway", "interactive", "ttft_p50_s"))
    if base is not None and ours is not None:
        lines.append(f"steady: interactive P50 TTFT gateway - baseline = {(ours - base) * 1000:+.1f} ms "
                     f"({ours / base:.2f}x)")
    return lines


def _tenants_p99(results: dict[str, Any], scenario: str, system: str, tenants: tuple[str, ...]) -> float | None:
    """The worst P99 TTFT of the named tenants in one run."""
    summary = results["scenarios"].get(scenario, {}).get("systems", {}).get(system)
    values = [summary["tenants"][t]["ttft_p99_s"] for t in tenants
              if summary and t in summary["tenants"] and summary["tenants"][t]["ttft_p99_s"] is not None]
    return max(values) if values else None


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its report (``soak``: bench/soak.py)."""
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["soak"]:
        from bench.soak import main as soak

        return soak(given[1:])
    from tqdm import tqdm

    from bench import report

    args = _arguments(argv)
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")
    scenarios = plain = [Scenario.load(path) for path in args.scenarios]
    context = getattr(args, "context_tokens", None)
    if args.mode == "live" and context is None and args.model == "bench" and not args.simulated:
        context = BENCH_MODEL_CONTEXT
    rate_scale, duration_scale = args.rate_scale or 1.0, args.duration_scale
    if args.mode == "live" and args.simulated:
        context = 16384  # the production context the profile's pools are sized for
        # engines S times slower: the same requests, arriving S times less often, over S times as long
        rate_scale, duration_scale = rate_scale / args.time_scale, duration_scale * args.time_scale
        scenarios = [s.dilated(args.time_scale) for s in scenarios]
    real_engines = sweep.real_engines(args)
    skipped = [s.name for s in scenarios if s.shares_prefixes and not real_engines]
    if skipped:
        print("skipped (their tenants share prefixes, and no prefix cache is simulated): " + ", ".join(skipped))
    capacity_needed = args.loads or (args.rate_scale is None and any(s.offered_load for s in plain))
    if real_engines and args.model in LIVE_PROFILES and capacity_needed:
        args.host_cost = host_cost_model(args.model, _calibration_core(args))  # before the runner takes cores
    if args.loads:
        return _sweep(args, argv, plain, scenarios, systems, rate_scale, duration_scale, context)
    offered = {s.name: _offered(args, p, rate_scale, context) for s, p in zip(scenarios, plain)}
    workloads = {s.name: generate(s, offered[s.name]["rate_scale"], duration_scale, context) for s in scenarios}
    plan = [(s, label, system, without) for s in scenarios
            for label, system, without in _runs(s, systems, not args.no_references, real_engines)]
    if args.mode == "live":  # one deployment per system: run all its scenarios before switching
        plan.sort(key=lambda run: SYSTEMS.index(run[2]))
    total = sum(len([r for r in workloads[s.name] if r.tenant not in without]) for s, _, _, without in plan)
    runner = _sim_runner(args) if args.mode == "sim" else _live_runner(args)
    results: dict[str, Any] = {"meta": _meta(args, argv, runner), "scenarios": {}}
    records: dict[str, dict[str, list[RequestRecord]]] = {}
    with tqdm(total=total, unit="req", desc=args.mode, dynamic_ncols=True) as bar:
        try:
            for scenario, label, system, without in plan:
                workload = [r for r in workloads[scenario.name] if r.tenant not in without]
                bar.set_postfix_str(f"{scenario.name} / {label}")
                got = runner.run(system, scenario, workload, bar.update)
                entry = results["scenarios"].setdefault(scenario.name, {
                    "description": scenario.description, "requests": len(workloads[scenario.name]),
                    "duration_s": scenario.duration_s * duration_scale, **offered[scenario.name],
                    "busiest_rps": busiest_rate(workloads[scenario.name]), "systems": {}})
                entry["systems"][label] = summarise(got, scenario.slo, scenario.fairness_window_s)
                if getattr(runner, "last_headroom", None) is not None:
                    entry["systems"][label]["headroom"] = runner.last_headroom
                if getattr(runner, "last_queues", None) is not None:
                    entry["systems"][label]["queues"] = runner.last_queues
                if getattr(runner, "last_engine_time", None) is not None:
                    entry["systems"][label]["engine_time"] = runner.last_engine_time
                if not without:
                    records.setdefault(scenario.name, {})[label] = got
                if args.records:
                    write_records(args.out / "records" / f"{scenario.name}--{label.replace(' ', '-')}.jsonl", got)
                args.out.mkdir(parents=True, exist_ok=True)  # what has run so far survives a later failure
                (args.out / "results.json").write_text(json.dumps(results, indent=1))
        finally:
            runner.close()
    results["ratios"] = ratios(results)
    summary = report.write(args.out, results, records)
    print(summary.read_text())
    print(f"report: {summary}")
    return 0


def _calibration_core(args: argparse.Namespace) -> int:
    """The core the engines will run on (where their step times are measured)."""
    from bench.live import engine_cores_option

    cores = engine_cores_option(args.engine_cores)
    return cores[0] if cores else max(os.sched_getaffinity(0))


def _offered(args: argparse.Namespace, scenario: Scenario, rate_scale: float, context: int | None) -> dict[str, Any]:
    """The rate scale a scenario runs at: ``rate_scale`` as given, or (live, none given, a scenario with a
    ``offered_load``) the one that offers that many times the fleet's modelled capacity for its mix."""
    if args.rate_scale is not None or args.mode != "live" or scenario.offered_load is None:
        return {"rate_scale": rate_scale}
    capacity, how = sweep.capacity_for(args, scenario, context)
    return {"rate_scale": round(rate_scale * rate_scale_for(scenario.offered_load, scenario, capacity, context), 4),
            "load": scenario.offered_load, "capacity_rps": round(capacity, 3), "capacity_model": how}


def _meta(args: argparse.Namespace, argv: list[str] | None, runner) -> dict[str, str]:
    """What a report says of its run: mode, where, the client, the command, when."""
    given = argv if argv is not None else sys.argv[1:]
    return {"mode": args.mode, "where": runner.where, "note": runner.note,
            "command": "python -m bench " + " ".join(shlex.quote(a) for a in given),
            "started": datetime.datetime.now().isoformat(timespec="seconds")}


def _sweep(args: argparse.Namespace, argv: list[str] | None, plain: list[Scenario], scenarios: list[Scenario],
           systems: list[str], rate_scale: float, duration_scale: float, context: int | None) -> int:
    from tqdm import tqdm

    runner = _sim_runner(args) if args.mode == "sim" else _live_runner(args)
    meta = _meta(args, argv, runner)
    with tqdm(unit="req", desc=f"{args.mode} sweep", dynamic_ncols=True) as bar:
        try:
            results = sweep.sweep(args, meta, plain, scenarios, systems, runner, rate_scale, duration_scale, context,
                                  bar.update)
        finally:
            runner.close()
    sweep.plots(args.out, results)
    summary = args.out / "sweep.md"
    summary.write_text(sweep.markdown(results, meta))
    print(summary.read_text())
    return 0


class _SimRunner:
    def __init__(self, args: argparse.Namespace) -> None:
        from bench.systems import PROFILES, build_systems
        from replicas.sim_engine import COST_MODELS

        profile = PROFILES[args.profile]
        self.cost = COST_MODELS[profile.cost_model].slowed(args.slowdown)
        self.systems = build_systems(args.profile, args.replicas)
        if args.queue_overhead_ms is not None:
            self.systems["gateway"] = self.systems["gateway"].model_copy(
                update={"queue_overhead_s": args.queue_overhead_ms / 1000})
        self.where = f"discrete-event simulation, {args.replicas} replicas, profile {args.profile}" + (
            f", steps {args.slowdown:g}x slower" if args.slowdown != 1 else "")
        self.note = f"cost model: {self.cost.source}"

    def run(self, system: str, scenario: Scenario, workload: list[PlannedRequest], progress) -> list[RequestRecord]:
        from bench.des import FleetSimulation, engine_time

        simulation = FleetSimulation(self.systems[system], self.cost, seed=scenario.seed)
        records = simulation.run(workload, progress)
        self.last_engine_time = engine_time(simulation)
        return records

    def close(self) -> None:
        pass


def _sim_runner(args: argparse.Namespace) -> _SimRunner:
    return _SimRunner(args)


def _live_runner(args: argparse.Namespace):
    from bench.live import LiveRunner, engine_cores_option

    return LiveRunner(args.config, args.max_in_flight, args.out, args.simulated, args.replicas, args.model,
                      args.time_scale, args.baseline_config, engine_cores_option(args.engine_cores))


if __name__ == "__main__":
    raise SystemExit(main())
