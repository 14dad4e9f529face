"""``python -m bench sim|live --loads 0.5,1,2,3``: a load sweep. Every system runs each scenario at each
offered load, as a multiple of the fleet's capacity for the scenario's mix (bench/capacity.py), and the report
plots, per scenario, the interactive P99 TTFT and the batch band's throughput against the load: where each
system's knee is.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.capacity import capacity_rps, rate_scale_for
from bench.systems import systems_for
from bench.workload import Scenario, generate
from replicas.sim_engine import COST_MODELS

LIVE_PROFILES = {"bench": "cpu-bench", "tiny": "cpu-tiny"}  # a model folder: the GPU profile
LIVE_ENGINES = 2  # vLLM engines in every live system (deploy/local.yaml's pools; the baseline's replicas)


def real_engines(args: argparse.Namespace) -> bool:
    """Whether the systems run real vLLM engines (with their prefix caches), not simulated ones."""
    return args.mode == "live" and not args.simulated


def capacity_for(args: argparse.Namespace, scenario: Scenario, context: int | None) -> tuple[float, str]:
    """The fleet's capacity for the scenario (req/s, at the engines' own speed) and how it was modelled."""
    if args.mode == "sim":
        profile, replicas, slowed = args.profile, args.replicas, args.slowdown
    elif args.simulated:
        profile, replicas, slowed = args.simulated, args.replicas, 1.0
    else:
        from bench.live import engine_cores_option

        profile, replicas = LIVE_PROFILES.get(args.model, "gpu-h100-llama3-8b"), LIVE_ENGINES
        cores = engine_cores_option(args.engine_cores)
        slowed = replicas / len(cores) if cores else 1.0  # engines sharing their cores step that much slower
    from bench.systems import PROFILES

    host = getattr(args, "host_cost", None)  # live, a local model: its steps measured on this host
    cost = (host or COST_MODELS[PROFILES[profile].cost_model]).slowed(slowed)
    how = f"DES, baseline on {replicas} replicas of " + (f"the {args.model} model as calibrated on this host" if host
                                                          else f"profile {profile}") + (
        f", steps {slowed:g}x slower (engines sharing cores)" if slowed != 1 else "")
    return capacity_rps(scenario, profile, replicas, cost, context), how


def sweep(args: argparse.Namespace, meta: dict[str, str], plain: list[Scenario], run_as: list[Scenario], systems: list[str], runner,
          rate_scale: float, duration_scale: float, context: int | None, progress: Callable[[int], None]
          ) -> dict[str, Any]:
    """Run every system on every scenario at every load, writing ``meta`` and the results so far to
    sweep.json after each run; ``plain`` are the scenarios as written (capacity is taken on them), ``run_as``
    what runs (dilated for time-scaled replicas, with ``rate_scale`` and ``duration_scale`` already holding the
    dilation)."""
    loads = [float(x) for x in args.loads.split(",")]
    results: dict[str, Any] = {}
    plan = []
    for scenario, running in zip(plain, run_as):
        runs_on = systems_for(scenario.shares_prefixes, systems, real_engines(args))
        if not runs_on:  # shared prefixes on simulated engines: nothing to compare
            continue
        capacity, how = capacity_for(args, scenario, context)
        entry = results.setdefault(scenario.name, {"capacity_rps": round(capacity, 3), "capacity_model": how,
                                                   "description": scenario.description, "loads": {}})
        for load in loads:
            scale = rate_scale * rate_scale_for(load, scenario, capacity, context)
            workload = generate(running, scale, duration_scale, context)
            entry["loads"][str(load)] = {"rate_scale": round(scale, 4), "requests": len(workload), "systems": {}}
            plan += [(scenario.name, running, load, system, workload) for system in runs_on]
    plan.sort(key=lambda run: systems.index(run[3]))  # live: one deployment per system
    from bench.metrics import summarise

    for name, running, load, system, workload in plan:
        records = runner.run(system, running, workload, progress)
        summary = summarise(records, running.slo, running.fairness_window_s)
        figures = {"interactive_ttft_p99_s": summary["bands"].get("interactive", {}).get("ttft_p99_s"),
                   "interactive_ttft_p50_s": summary["bands"].get("interactive", {}).get("ttft_p50_s"),
                   "batch_tokens_per_s": summary["bands"].get("batch", {}).get("tokens_per_s"),
                   "batch_ttft_p99_s": summary["bands"].get("batch", {}).get("ttft_p99_s"),
                   "served": summary["overall"]["served"], "rejected": summary["overall"]["rejected"],
                   "span_s": round(summary["span_s"], 1)}
        if getattr(runner, "last_headroom", None) is not None:
            figures["headroom"] = runner.last_headroom
        results[name]["loads"][str(load)]["systems"][system] = figures
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sweep.json").write_text(json.dumps({"meta": meta, "scenarios": results}, indent=1))
    return results


def markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    """One table per scenario: each system's figures at each load."""
    lines = [f"# Load sweep: {meta['mode']} ({meta['where']})", "", f"Command: `{meta['command']}`", ""]
    for name, entry in results.items():
        lines += [f"## {name}", "", f"Capacity {entry['capacity_rps']:.3g} req/s ({entry['capacity_model']}).", "",
                  "| load | system | requests | interactive TTFT p50 / p99 (s) | batch tokens/s | batch TTFT p99 (s) "
                  "| rejected | host starved |", "|---|---|---|---|---|---|---|---|"]
        for load, point in entry["loads"].items():
            for system, f in point["systems"].items():
                starved = (f.get("headroom") or {}).get("host_starved")
                lines.append(f"| {load}x | {system} | {point['requests']} | {_s(f['interactive_ttft_p50_s'])} / "
                             f"{_s(f['interactive_ttft_p99_s'])} | {_n(f['batch_tokens_per_s'])} | "
                             f"{_s(f['batch_ttft_p99_s'])} | {sum(f['rejected'].values())} | "
                             f"{'–' if starved is None else ('**yes**' if starved else 'no')} |")
        lines.append("")
    return "\n".join(lines)


def plots(out_dir: Path, results: dict[str, Any]) -> list[Path]:
    """Per scenario: interactive P99 TTFT, and the batch band's throughput, against the load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.report import _save

    written = []
    for name, entry in results.items():
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        systems = list(next(iter(entry["loads"].values()))["systems"])
        for system in systems:
            points = [(float(load), p["systems"][system]) for load, p in entry["loads"].items()
                      if system in p["systems"]]
            for ax, key in zip(axes, ("interactive_ttft_p99_s", "batch_tokens_per_s")):
                xy = [(load, f[key], _starved(f)) for load, f in points if f[key] is not None]
                line, = ax.plot([x for x, _, _ in xy], [y for _, y, _ in xy], "-", label=system)
                for x, y, starved in xy:  # a host-starved point is hollow: no conclusion from it
                    ax.plot([x], [y], "o", color=line.get_color(), markerfacecolor="none" if starved else None)
        axes[0].set_yscale("log")
        axes[0].set_title(f"{name}: interactive P99 TTFT (s)")
        axes[1].set_title(f"{name}: batch band throughput (tokens/s)")
        for ax in axes:
            ax.set_xlabel("offered load (x capacity); hollow: host-starved")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        written.append(_save(fig, out_dir / f"{name}-sweep.png"))
    return written


def _starved(figures: dict[str, Any]) -> bool:
    return bool((figures.get("headroom") or {}).get("host_starved"))


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _n(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"
