"""Host headroom during a live scenario: did the engines get the cores, and did everything else (the Serve
proxy, the gateways, Redis, the load client) keep up? A scenario whose non-engine side was starved measures
the host, not the system under test, and is flagged.

* CPU, sampled from /proc every ``period_s``: cores used by the engines (vLLM's ``VLLM::`` engine-core
  processes, or the simulated replicas' actors) and by everything else, and the host's idle cores.
* Event-loop lag (:class:`fleet.loop_lag.LoopLagMonitor`): the load client's own, and the gateways' from
  their ``fleetgate_event_loop_lag_seconds`` histogram (scraped before and after the scenario).
* Ray Serve's own event-loop lag (``ray_serve_event_loop_scheduling_latency_ms``, from Ray's metrics export),
  the same instrument for every system: the Serve proxy, the ingress (the gateway, or Ray Serve LLM's
  ``OpenAiIngress``) and the engine replicas' front ends. Ray samples it every 5 s unless told otherwise
  (:func:`serve_lag_env`).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path

STARVED_LAG_S = 0.020  # a loop this late (P99) is no longer keeping up
# Ray's lag buckets are 10 and 25 ms around that limit: a P99 above 25 ms is the exact statement nearest to it
STARVED_SERVE_LAG_S = 0.025
SERVE_LAG_GROUPS = ("proxy", "ingress", "engine front ends")
FLAGGING_SERVE_GROUPS = ("proxy", "ingress")  # the non-engine side the verdict is about
_SERVE_LAG = "ray_serve_event_loop_scheduling_latency_ms"
_TICK = os.sysconf("SC_CLK_TCK")


def _process_times(is_engine, known: dict[int, bool]) -> tuple[float, float]:
    """CPU seconds so far of (engine processes, every other process). ``known`` remembers which processes
    are engines, so each sample reads one small file per process."""
    engine = other = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = (entry / "stat").read_text()
            if pid not in known:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                known[pid] = is_engine(stat[stat.index("(") + 1: stat.rindex(")")], cmdline)
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        seconds = (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
        if known[pid]:
            engine += seconds
        else:
            other += seconds
    return engine, other


def _idle_seconds() -> float:
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    return (int(fields[3]) + int(fields[4])) / _TICK  # idle + iowait, over all cores


def _sample(is_engine, period_s: float, stop, results) -> None:
    """The sampler process: every ``period_s`` until ``stop``, the cores used since the last sample by the
    engines and by the rest, and the idle cores; sends the list of them to ``results`` at the end."""
    samples: list[tuple[float, ...]] = []
    known: dict[int, bool] = {}
    last = (time.monotonic(), *_process_times(is_engine, known), _idle_seconds())
    while not stop.wait(period_s):
        now = (time.monotonic(), *_process_times(is_engine, known), _idle_seconds())
        elapsed = now[0] - last[0]
        samples.append(tuple(max(0.0, (b - a) / elapsed) for a, b in zip(last[1:], now[1:])))
        last = now
    results.send(samples)


def real_engine(comm: str, cmdline: str) -> bool:
    """vLLM's engine-core process (it steps the model)."""
    return comm.startswith("VLLM::")


def simulated_engine(comm: str, cmdline: str) -> bool:
    """A simulated replica's actor (its engine loop runs there)."""
    return "ServeReplica:" in cmdline and ":vllm-" in cmdline


class CpuSampler:
    """Samples CPU use by engines and by everything else, from start to stop, in a process of its own: a
    sampling thread in the load client's process would take the client's GIL for the milliseconds each pass
    over /proc takes, and the client's loop would lag for it."""

    def __init__(self, is_engine=real_engine, period_s: float = 0.5) -> None:
        context = multiprocessing.get_context("fork")
        self._stop = context.Event()
        self._results, sender = context.Pipe(duplex=False)
        self._process = context.Process(target=_sample, args=(is_engine, period_s, self._stop, sender), daemon=True)
        self._samples: list[tuple[float, float, float]] = []  # (engine cores, other cores, idle cores)

    def __enter__(self) -> "CpuSampler":
        self._process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._results.poll(30):  # a sampler that died leaves the record empty, never the run hanging
            self._samples = self._results.recv()
        self._process.join(5)

    def summary(self) -> dict[str, float]:
        """Mean cores used by the engines and by the rest, and the mean and least idle cores."""
        if not self._samples:
            return {}
        engine, other, idle = zip(*self._samples)
        return {"engine_cores": round(sum(engine) / len(engine), 2), "other_cores": round(sum(other) / len(other), 2),
                "idle_cores_mean": round(sum(idle) / len(idle), 2), "idle_cores_min": round(min(idle), 2)}


def histograms(metrics_text: str, family_name: str, group_of: Callable[[dict[str, str]], str | None],
                units_per_second: float = 1.0) -> dict[str, dict[float, float]]:
    """Histogram ``family_name``'s buckets summed per group (cumulative count per upper bound in seconds);
    ``group_of`` names a sample's group from its labels (None: left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    groups: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != family_name:
            continue
        for sample in family.samples:
            group = group_of(sample.labels)
            if sample.name.endswith("_bucket") and group is not None:
                bound = float(sample.labels["le"]) / units_per_second
                buckets = groups.setdefault(group, {})
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return groups


def lag_histogram(metrics_text: str) -> dict[float, float]:
    """The gateways' event-loop lag histogram (cumulative count per upper bound, summed over gateways)."""
    return histograms(metrics_text, "fleetgate_event_loop_lag_seconds", lambda labels: "gateways").get("gateways", {})


def scrape_lag_histogram(base_url: str) -> dict[float, float]:
    """The gateways' loop-lag histogram now, from ``base_url``/metrics (empty if it cannot be scraped)."""
    import httpx

    try:
        return lag_histogram(httpx.get(f"{base_url}/metrics", timeout=30).text)
    except httpx.HTTPError:
        return {}


def histogram_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The ``q`` quantile between two scrapes, as the upper bound of the bucket it falls in (None: no
    samples)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    for bound, count in zip(bounds, counts):
        if count >= q * counts[-1]:
            return bound
    return bounds[-1]


def histogram_p99(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The P99 between two scrapes, as the upper bound of the bucket it falls in (None: no samples)."""
    return histogram_quantile(before, after, 0.99)


def verdict(client_lag_p99_s: float | None, gateway_lag_p99_s: float | None) -> bool:
    """True when the non-engine side was starved: either loop's P99 lag above STARVED_LAG_S."""
    return any(lag is not None and lag > STARVED_LAG_S for lag in (client_lag_p99_s, gateway_lag_p99_s))


def serve_lag_env(interval_s: float = 0.05, report_interval_ms: int = 1000) -> dict[str, str]:
    """Environment for a `serve run` whose Serve event loops are sampled often enough for a P99 over one
    scenario (Ray's default is every 5 s), and whose workers report their metrics every second."""
    return {"RAY_SERVE_EVENT_LOOP_MONITORING_INTERVAL_S": f"{interval_s:g}",
            "RAY_metrics_report_interval_ms": str(report_interval_ms)}


def _serve_group(labels: dict[str, str]) -> str | None:
    """Which part of the system a Ray Serve loop belongs to (None: a handle's router loop, whose process the
    labels do not name)."""
    if labels.get("component") == "proxy":
        return "proxy"
    deployment = labels.get("deployment") or ""
    if not deployment:
        return None
    return "engine front ends" if deployment.startswith(("vllm-", "LLMServer")) else "ingress"


def serve_lag_histograms(metrics_text: str) -> dict[str, dict[float, float]]:
    """Ray Serve's event-loop lag histograms by group (cumulative count per upper bound in seconds, summed
    over the group's loops; Ray's bounds are in milliseconds)."""
    return histograms(metrics_text, _SERVE_LAG, _serve_group, units_per_second=1000)


def scrape_serve_lags(session_dir: Path = Path("/tmp/ray/session_latest")) -> dict[str, dict[float, float]]:
    """Ray Serve's loop-lag histograms now, from the local Ray node's metrics export (empty if there is none)."""
    import httpx

    try:
        port = next(session_dir.glob("metrics_export_port_*")).read_text().strip()
        return serve_lag_histograms(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text)
    except (StopIteration, OSError, ValueError, httpx.HTTPError):
        return {}


def serve_lag_p99s(before: dict[str, dict[float, float]],
                   after: dict[str, dict[float, float]]) -> dict[str, float | None]:
    """Each group's P99 lag between two scrapes (the upper bound of its bucket; None: no samples)."""
    return {group: histogram_p99(before.get(group, {}), after[group]) for group in SERVE_LAG_GROUPS if group in after}


def serve_starved(p99s: dict[str, float | None]) -> bool:
    """True when Ray Serve's proxy or ingress loops lagged past STARVED_SERVE_LAG_S at P99."""
    return any((p99s.get(group) or 0.0) > STARVED_SERVE_LAG_S for group in FLAGGING_SERVE_GROUPS)
