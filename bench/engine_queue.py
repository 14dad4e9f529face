"""Where a live run's backlog waited: in the engines' own queues, or in the global queue.

The gate's promise is that each engine's queue stays near its configured threshold while the global queue
holds the rest, so that bands and fairness still apply to what waits. :class:`QueueSampler` checks it from
the operator's side, scraping the gateway's ``/metrics`` once a second while a scenario runs:

* per replica, the waiting requests its engine last reported (``fleetgate_replica_engine_waiting``) and
  what the gate counts as not started against the top band's limit (``fleetgate_replica_pending_tokens``
  over ``fleetgate_replica_gate_limit_tokens``: above 1 the gate is closed to every band);
* the global queue's depth (``fleetgate_band_queue_depth``, all bands);
* and, between the scenario's start and end, vLLM's own ``vllm:request_queue_time_seconds``: how long
  requests waited in the engines' queues before their first step, P50 and P99 (bucket upper bounds);
* between the same two scrapes, where the gateway's time went: each stage of a request
  (``fleetgate_request_stage_seconds``) and each part of its wait for the first token
  (``fleetgate_first_token_part_seconds``), P50 and P99 (bucket upper bounds).

Only systems behind the gateway have that endpoint; the baselines' figures are left out.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

from bench.headroom import histogram_quantile, histograms
from bench.metrics import percentile

ENGINE_QUEUE_TIME = "vllm:request_queue_time_seconds"
STAGES = "fleetgate_request_stage_seconds"
FIRST_TOKEN_PARTS = "fleetgate_first_token_part_seconds"
_WANTED = ("fleetgate_replica_engine_waiting", "fleetgate_replica_pending_tokens",
           "fleetgate_replica_gate_limit_tokens", "fleetgate_band_queue_depth")
_KEPT_LINES = _WANTED + tuple(f"# TYPE {name} " for name in _WANTED)  # their samples and their types


def queue_sample(metrics_text: str) -> dict[str, Any]:
    """One scrape's figures: per replica its engine's waiting requests and pending/limit ratio, and the global
    queue's depth."""
    from prometheus_client.parser import text_string_to_metric_families

    # only the families read here go through the (slow, pure Python) parser: a fleet scrape is ~100 kB
    metrics_text = "\n".join(line for line in metrics_text.splitlines() if line.startswith(_KEPT_LINES)) + "\n"
    waiting: dict[str, float] = {}
    pending: dict[str, float] = {}
    limit: dict[str, float] = {}
    depth = 0.0
    wanted = {"fleetgate_replica_engine_waiting": waiting, "fleetgate_replica_pending_tokens": pending,
              "fleetgate_replica_gate_limit_tokens": limit}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "fleetgate_band_queue_depth":
            depth += sum(sample.value for sample in family.samples)
        elif family.name in wanted:
            for sample in family.samples:
                wanted[family.name][sample.labels.get("replica", "")] = sample.value
    return {"engine_waiting": waiting,
            "pending_over_limit": {r: pending[r] / limit[r] for r in pending if limit.get(r)},
            "global_depth": depth}


def engine_queue_times(metrics_text: str) -> dict[float, float]:
    """vLLM's engine queue-time histogram, summed over every replica (cumulative count per upper bound)."""
    return histograms(metrics_text, ENGINE_QUEUE_TIME, lambda labels: "engines").get("engines", {})


def stage_histograms(metrics_text: str) -> dict[str, dict[float, float]]:
    """The gateway's stage and first-token-part histograms, by stage or part name (summed over gateways)."""
    return {**histograms(metrics_text, STAGES, lambda labels: labels.get("stage")),
            **histograms(metrics_text, FIRST_TOKEN_PARTS, lambda labels: labels.get("part"))}


def stage_quantiles(before: dict[str, dict[float, float]],
                    after: dict[str, dict[float, float]]) -> dict[str, list[float | None]]:
    """[P50, P99] in seconds (bucket upper bounds) of each stage with samples between the two scrapes."""
    quantiles = {name: [histogram_quantile(before.get(name, {}), buckets, q) for q in (0.5, 0.99)]
                 for name, buckets in after.items()}
    return {name: pair for name, pair in quantiles.items() if pair[0] is not None}


def summarise_samples(samples: list[dict[str, Any]], before: dict[float, float],
                      after: dict[float, float]) -> dict[str, Any]:
    """The run's figures: per replica the most and P99 engine waiting and pending/limit ratio, the global
    queue's deepest point, and the engine queue time between ``before`` and ``after``."""
    replicas = sorted({r for s in samples for r in s["engine_waiting"]})

    def series(key: str, replica: str) -> list[float]:
        return [s[key][replica] for s in samples if replica in s[key]]

    per_replica = {}
    for replica in replicas:
        waiting, ratio = series("engine_waiting", replica), series("pending_over_limit", replica)
        per_replica[replica] = {"engine_waiting_max": max(waiting, default=None),
                                "engine_waiting_p99": percentile(waiting, 99),
                                "pending_over_limit_max": round(max(ratio), 2) if ratio else None,
                                "pending_over_limit_p99": None if not ratio else round(percentile(ratio, 99), 2)}
    return {"samples": len(samples), "replicas": per_replica,
            "global_depth_max": max((s["global_depth"] for s in samples), default=None),
            "engine_queue_p50_s": histogram_quantile(before, after, 0.5),
            "engine_queue_p99_s": histogram_quantile(before, after, 0.99)}


def _sample(url: str, period_s: float, fetch: Callable[[str], str], stop, results) -> None:
    """The sampler process: a scrape every ``period_s`` until ``stop``; sends the list of samples at the end."""
    samples = []
    while not stop.wait(period_s):
        text = _text(fetch, url)
        if text:
            samples.append(queue_sample(text))
    results.send(samples)


class QueueSampler:
    """Scrapes ``base_url``/metrics every ``period_s`` while the ``with`` block runs, in a process of its own
    (as :class:`bench.headroom.CpuSampler`: parsing a scrape in the load client's process would take its GIL)."""

    def __init__(self, base_url: str, period_s: float = 1.0, fetch: Callable[[str], str] | None = None) -> None:
        context = multiprocessing.get_context("fork")
        self._url = f"{base_url}/metrics"
        self._fetch = fetch or _get
        self._stop = context.Event()
        self._results, sender = context.Pipe(duplex=False)
        self._process = context.Process(target=_sample, args=(self._url, period_s, self._fetch, self._stop, sender),
                                        daemon=True)
        self.samples: list[dict[str, Any]] = []
        self.before: dict[float, float] = {}
        self.stages_before: dict[str, dict[float, float]] = {}

    def __enter__(self) -> "QueueSampler":
        self.before, self.stages_before = self._histograms()
        self._process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._results.poll(30):  # a sampler that died leaves no samples, never the run hanging
            self.samples = self._results.recv()
        self._process.join(5)

    def summary(self) -> dict[str, Any]:
        """Call after the ``with`` block, once the replicas have published their last metrics."""
        engine_queue, stages = self._histograms()
        summary = summarise_samples(self.samples, self.before, engine_queue)
        summary["stages_s"] = stage_quantiles(self.stages_before, stages)
        return summary

    def _histograms(self) -> tuple[dict[float, float], dict[str, dict[float, float]]]:
        """One scrape's engine queue-time histogram and stage histograms (a failed scrape: both empty)."""
        text = _text(self._fetch, self._url)
        return engine_queue_times(text), stage_histograms(text)


def _text(fetch: Callable[[str], str], url: str) -> str:
    try:
        return fetch(url)
    except Exception:  # a scrape that fails is a gap in the samples, not a failed run
        return ""


def _get(url: str) -> str:
    import httpx

    return httpx.get(url, timeout=10).text
