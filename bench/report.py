"""The benchmark report: results JSON, a Markdown summary and PNG plots per scenario.

Plots (matplotlib, the ``bench`` extra): TTFT CDF per band and system; interactive TTFT over the run (how
the tail grows during overload); weighted service per tenant over time (fairness at a glance).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.headroom import SERVE_LAG_GROUPS
from bench.metrics import RequestRecord, service_events

COLUMNS = [  # (header, band or None for overall, key, scale, format)
    ("interactive TTFT p50 (s)", "interactive", "ttft_p50_s", 1, "{:.3f}"),
    ("interactive TTFT p99 (s)", "interactive", "ttft_p99_s", 1, "{:.3f}"),
    ("standard TTFT p99 (s)", "standard", "ttft_p99_s", 1, "{:.3f}"),
    ("batch TTFT p99 (s)", "batch", "ttft_p99_s", 1, "{:.2f}"),
    ("ITL p99 (ms)", None, "itl_p99_s", 1000, "{:.1f}"),
    ("interactive ITL p99 (ms)", "interactive", "itl_p99_s", 1000, "{:.1f}"),
    ("interactive worst gap p99 (ms)", "interactive", "stall_p99_s", 1000, "{:.0f}"),
    ("goodput (req/s)", None, "goodput_rps", 1, "{:.2f}"),
    ("SLO met", None, "slo_attainment", 100, "{:.0f}%"),
]


def _cell(summary: dict, band: str | None, key: str, scale: float, fmt: str) -> str:
    group = summary["overall"] if band is None else summary["bands"].get(band)
    value = None if group is None else group.get(key)
    return "–" if value is None else fmt.format(value * scale)


def markdown(results: dict[str, Any]) -> str:
    """The summary tables (one per scenario) and the headline ratios."""
    meta = results["meta"]
    lines = [f"# Benchmark: {meta['mode']} ({meta['where']})", "",
             f"Command: `{meta['command']}`", "", f"Started {meta['started']}; {meta['note']}", ""]
    for name, scenario in results["scenarios"].items():
        lines += [f"## {name}", "", scenario["description"].strip(), "",
                  f"{scenario['requests']} requests over {scenario['duration_s']:.0f} s" + _offered(scenario) + ".", ""]
        headers = ["system"] + [c[0] for c in COLUMNS] + ["rejected", "Jain min (fair shares)",
                                                         "least fair share", "Jain min (plain)"]
        lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        for system, summary in scenario["systems"].items():
            fair = summary["fairness"]
            rejected = sum(summary["overall"]["rejected"].values())
            row = [system] + [_cell(summary, *c[1:]) for c in COLUMNS] + [str(rejected)] + [
                "–" if fair.get(key) is None else f"{fair[key]:.2f}"
                for key in ("jain_min", "fair_share_min", "jain_plain_min")]
            lines.append("| " + " | ".join(row) + " |")
        lines += _wait_table(scenario)
        lines += _tail_table(scenario)
        lines += _headroom_table(scenario)
        lines += _queues_table(scenario)
        lines += _stages_table(scenario)
        lines += _engine_time_table(scenario)
        tenants = sorted({t for summary in scenario["systems"].values() for t in summary["tenants"]})
        lines += ["", "TTFT p50 / p99 (s) per tenant:", "",
                  "| system | " + " | ".join(tenants) + " |", "|" + "---|" * (len(tenants) + 1)]
        for system, summary in scenario["systems"].items():
            cells = []
            for tenant in tenants:
                group = summary["tenants"].get(tenant)
                p50, p99 = (group or {}).get("ttft_p50_s"), (group or {}).get("ttft_p99_s")
                cells.append("–" if p50 is None else f"{p50:.2f} / {p99:.2f}")
            lines.append(f"| {system} | " + " | ".join(cells) + " |")
        lines += ["", f"![TTFT CDF]({name}-ttft-cdf.png) ![TTFT over time]({name}-ttft-over-time.png) "
                      f"![service]({name}-service.png)", ""]
    if results.get("ratios"):
        lines += ["## Ratios", ""] + [f"- {line}" for line in results["ratios"]] + [""]
    return "\n".join(lines)


def _headroom_table(scenario: dict) -> list[str]:
    """Live runs: the host's headroom per system, and which runs were host-starved (no conclusion from them)."""
    runs = {system: summary["headroom"] for system, summary in scenario["systems"].items() if summary.get("headroom")}
    if not runs:
        return []

    def value(headroom: dict, key: str) -> str:
        return "–" if headroom.get(key) is None else f"{headroom[key]:g}"

    def serve_lags(headroom: dict) -> str:
        lags = headroom.get("serve_loop_lag_p99_ms") or {}
        return " / ".join("–" if lags.get(g) is None else f"≤{lags[g]:g}" for g in SERVE_LAG_GROUPS)

    rows = [f"| {system} | " + " | ".join(value(h, k) for k in ("engine_cores", "other_cores", "idle_cores_min",
                                                                 "client_loop_lag_p99_ms", "gateway_loop_lag_p99_ms"))
            + f" | {serve_lags(h)}"
            + (" | **host-starved: no conclusion** |" if h.get("host_starved") else " | engine-bound or idle |")
            for system, h in runs.items()]
    starved = [system for system, h in runs.items() if h.get("host_starved")]
    why = [] if not starved or not scenario.get("busiest_rps") else [
        "", f"Starved: {', '.join(starved)}. The busiest second of this scenario sent {scenario['busiest_rps']:g} "
        f"requests, {scenario['busiest_rps'] * scenario['duration_s'] / max(scenario['requests'], 1):.1f}x its "
        "average rate" + (f" and {scenario['busiest_rps'] / scenario['capacity_rps']:.1f}x the engines' calibrated "
                          "capacity" if scenario.get("capacity_rps") else "")
        + "; everything that is not an engine (Serve's proxy, the gateways, Redis, the load client) shares the "
        "cores the engines do not use, and its event loops lagged past the threshold while it took that in."]
    return ["", "Host headroom (cores used by the engines / by everything else / least idle; loop-lag P99, ms, of "
            "the load client and of the gateways (fleetgate's own histogram), over 20 ms is starved; Ray Serve's own "
            "loop-lag P99 bucket for every system, proxy / ingress / engine front ends, over 25 ms in the proxy or "
            "the ingress is starved):", "",
            "| system | engines | rest | idle (least) | client lag | gateway lag | Serve lag | regime |",
            "|---|---|---|---|---|---|---|---|", *rows, *why]


def _queues_table(scenario: dict) -> list[str]:
    """Live runs behind the gateway: where the backlog waited, per replica (bench/engine_queue.py)."""
    runs = {system: summary["queues"] for system, summary in scenario["systems"].items() if summary.get("queues")}
    if not runs:
        return []

    def cell(value: float | None, unit: str = "") -> str:
        return "–" if value is None else f"{value:g}{unit}"

    rows = [f"| {system} | {replica} | {cell(r['engine_waiting_max'])} / {cell(r['engine_waiting_p99'])} | "
            f"{cell(r['pending_over_limit_max'])} / {cell(r['pending_over_limit_p99'])} | "
            f"{cell(q['global_depth_max'])} | ≤{cell(q['engine_queue_p50_s'], ' s')} / ≤{cell(q['engine_queue_p99_s'], ' s')} |"
            for system, q in runs.items() for replica, r in q["replicas"].items()]
    return ["", "Where the backlog waited (the gateway's /metrics each second): per replica its engine's waiting "
            "requests, max / P99; what the gate counts as not started over the top band's limit, max / P99 (over 1: "
            "closed to every band); the global queue's deepest point; vLLM's engine queue time P50 / P99 (bucket "
            "bounds, all replicas):", "",
            "| system | replica | engine waiting | pending / limit | global queue max | engine queue time |",
            "|---|---|---|---|---|---|", *rows]


STAGE_ORDER = ("authorise", "parse", "count_tokens", "enqueue", "wait_grant", "first_token", "serve_hops",
               "grant_check", "render", "engine", "relay")


def _stages_table(scenario: dict) -> list[str]:
    """Live runs behind the gateway: where its requests' time went, stage by stage (bench/engine_queue.py)."""
    runs = {system: summary["queues"]["stages_s"] for system, summary in scenario["systems"].items()
            if (summary.get("queues") or {}).get("stages_s")}
    if not runs:
        return []
    names = sorted({name for stages in runs.values() for name in stages},
                   key=lambda n: (STAGE_ORDER.index(n) if n in STAGE_ORDER else len(STAGE_ORDER), n))

    def cell(pair: list[float | None] | None) -> str:
        return "–" if not pair else " / ".join(f"≤{value * 1000:g}" for value in pair)

    rows = [f"| {system} | " + " | ".join(cell(stages.get(name)) for name in names) + " |"
            for system, stages in runs.items()]
    return ["", "Where the gateway's time went (its /metrics before and after the scenario): P50 / P99 per stage, "
            "ms, bucket upper bounds (first_token is split into serve_hops, grant_check, render and engine):", "",
            "| system | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1), *rows]


def _engine_time_table(scenario: dict) -> list[str]:
    """Simulated runs: engine seconds per replica, per pool, by the length classes each step carried."""
    runs = {system: summary["engine_time"] for system, summary in scenario["systems"].items()
            if summary.get("engine_time")}
    if not runs:
        return []
    mixes = sorted({mix for pools in runs.values() for spent in pools.values() for mix in spent if mix != "replicas"})
    rows = [f"| {system} | {pool} ×{spent['replicas']} | " + " | ".join(f"{spent.get(mix, 0):.1f}" for mix in mixes)
            + f" | {sum(spent.get(mix, 0) for mix in mixes):.1f} |"
            for system, pools in runs.items() for pool, spent in pools.items()]
    return ["", "Engine time per replica (s), by the length classes a step carried:", "",
            "| system | pool | " + " | ".join(mixes) + " | all |", "|" + "---|" * (len(mixes) + 3), *rows]


def _wait_table(scenario: dict) -> list[str]:
    """Where each band's wait was: before the replica, and in the engine's own queue (when measured)."""
    bands = sorted({b for summary in scenario["systems"].values() for b in summary["bands"]},
                   key=lambda b: {"interactive": 0, "standard": 1, "batch": 2}.get(b, 3))
    rows = []
    for system, summary in scenario["systems"].items():
        cells = []
        for band in bands:
            group = summary["bands"].get(band) or {}
            values = [group.get(k) for k in ("queue_p50_s", "queue_p99_s", "engine_queue_p50_s", "engine_queue_p99_s")]
            cells.append("–" if values[0] is None else " / ".join("–" if v is None else f"{v:.2f}" for v in values))
        rows.append(f"| {system} | " + " | ".join(cells) + " |")
    if all(set(row.split(" | ")[1:]) <= {"–", "– |"} for row in rows):
        return []
    return ["", "Where the wait is, P50 / P99 before the replica (global queue or router) / P50 / P99 in the "
            "engine's own queue (s):", "", "| system | " + " | ".join(bands) + " |", "|" + "---|" * (len(bands) + 1),
            *rows]


def _tail_table(scenario: dict) -> list[str]:
    """The slowest 5% of each band's requests: which pool ran them, and where their time went."""
    rows = []
    for system, summary in scenario["systems"].items():
        for band, tail in (summary.get("tails") or {}).items():
            if not tail:
                continue
            pools = ", ".join(f"{pool} {count}" for pool, count in tail["pools"].items())
            waits = " / ".join("–" if tail[k] is None else f"{tail[k]:.2f}"
                               for k in ("queue_p50_s", "to_first_token_p50_s"))
            rows.append(f"| {system} | {band} | {tail['requests']} | {tail['ttft_from_s']:.2f} | {pools} | {waits} |")
    if not rows:
        return []
    return ["", "The slowest 5% of each band (by TTFT): the pools that ran them, and P50 of their wait before the "
            "replica / from reaching it to the first token (s):", "",
            "| system | band | requests | TTFT from (s) | pools | wait / to first token |", "|---|---|---|---|---|---|",
            *rows]


def plots(out_dir: Path, name: str, records: dict[str, list[RequestRecord]]) -> list[Path]:
    """Write the three PNGs of one scenario; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    bands = sorted({r.band for rs in records.values() for r in rs},
                   key=lambda b: {"interactive": 0, "standard": 1, "batch": 2}.get(b, 3))
    fig, axes = plt.subplots(1, len(bands), figsize=(5 * len(bands), 3.6), squeeze=False)
    for ax, band in zip(axes[0], bands):
        for system, rs in records.items():
            ttfts = sorted(r.ttft_s for r in rs if r.ok and r.band == band)
            if ttfts:
                ax.plot(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], label=system)
        ax.set_xscale("log")
        ax.set_title(f"{name}: TTFT CDF, {band}")
        ax.set_xlabel("TTFT (s)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    written.append(_save(fig, out_dir / f"{name}-ttft-cdf.png"))

    fig, ax = plt.subplots(figsize=(8, 3.6))
    focus = bands[0]
    for system, rs in records.items():
        points = sorted((r.send_s, r.ttft_s) for r in rs if r.ok and r.band == focus)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], ".", markersize=3, label=system)
    ax.set_yscale("log")
    ax.set_title(f"{name}: {focus} TTFT by send time")
    ax.set_xlabel("send time (s)")
    ax.set_ylabel("TTFT (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    written.append(_save(fig, out_dir / f"{name}-ttft-over-time.png"))

    systems = list(records)
    fig, axes = plt.subplots(1, len(systems), figsize=(4.2 * len(systems), 3.4), squeeze=False, sharey=True)
    for ax, system in zip(axes[0], systems):
        for tenant, events in sorted(service_events(records[system]).items()):
            events.sort()
            total, xs, ys = 0.0, [], []
            for t, amount in events:
                total += amount
                xs.append(t)
                ys.append(total)
            ax.plot(xs, ys, label=tenant)
        ax.set_title(system)
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("weighted tokens served")
    axes[0][0].legend(fontsize=7)
    written.append(_save(fig, out_dir / f"{name}-service.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _offered(scenario: dict) -> str:
    """How the scenario's load was set, where it was set from the fleet's capacity."""
    if "load" not in scenario:
        return ""
    return (f": {scenario['load']:g}x the fleet's capacity of {scenario['capacity_rps']:.3g} req/s for this mix "
            f"({scenario['capacity_model']}), rate scale {scenario['rate_scale']:g}")


def write(out_dir: Path, results: dict[str, Any], records: dict[str, dict[str, list[RequestRecord]]]) -> Path:
    """results.json, summary.md and the plots into ``out_dir``; returns the summary's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    for name, by_system in records.items():
        plots(out_dir, name, by_system)
    summary = out_dir / "summary.md"
    summary.write_text(markdown(results))
    return summary
