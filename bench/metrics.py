"""What a benchmark run measured, and the figures computed from it.

Every system (live or simulated) produces one :class:`RequestRecord` per planned request; the summaries
are computed the same way for all of them:

* latency per band and per tenant: P50/P90/P99 TTFT, P99 inter-token gap, P99 over requests of each
  stream's longest gap (the stall a reader sees; a P99 over all gaps hides rare long stalls), P50/P99
  end-to-end;
* goodput: requests per second that finished within their band's TTFT objective and the TPOT objective;
* where the wait is, where known: before the replica (the global queue, or Serve's router holding it at
  the caller) and in the engine's own queue (reached the replica, not yet scheduled: vLLM's
  ``request_queue_time``), P50 and P99 each;
* rejections (any non-200) by status;
* fairness, over the requests that were served: Jain's index over fixed windows, counting only tenants with
  work waiting throughout the window, of each one's weighted service (tokens / weight) against its max-min
  fair share (the window's service water-filled over the tenants' demands, demand being what a tenant was
  served plus what it still had waiting at the window's end: a tenant served all it asked for has had its
  share, however small); the least any such tenant got of its fair share (Jain's index is lenient with two
  or three tenants: 0.62 and 1.05 of their shares still score 0.94); the plain Jain's index of weighted
  service beside them; and the largest weighted service
  gap: the largest difference in weighted service between two tenants over any stretch both had work
  waiting throughout (VTC's bound says it stays within about twice the largest weighted request cost).
  Work waits from its send until an engine first schedules it, where that is known (the simulator), else
  until its first token: a request being prefilled is being served, and a tenant whose every request is
  served at once is not backlogged, however many it sends.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.workload import PlannedRequest, Slo


@dataclass
class RequestRecord:
    """One request's outcome as the client saw it (times in seconds from the run's start)."""

    request_id: str
    tenant: str
    band: str
    weight: float
    prompt_tokens: int
    output_tokens: int
    send_s: float
    status: int = 0  # 0: never finished
    first_token_s: float | None = None
    token_s: list[float] = field(default_factory=list)  # arrival time of every output chunk
    end_s: float | None = None
    error: str = ""
    dispatched_s: float | None = None  # reached its replica (after the global queue, or the router's wait)
    engine_start_s: float | None = None  # its engine first scheduled it (left the engine's own queue)
    pool: str = ""  # the pool that ran it (the gateway's x-fleetgate-pool; the simulator's replica pool)

    @classmethod
    def planned(cls, request: PlannedRequest) -> "RequestRecord":
        """A fresh record for a planned request."""
        return cls(request.request_id, request.tenant, request.band, request.weight, request.prompt_tokens,
                   request.output_tokens, request.send_s)

    @property
    def ok(self) -> bool:
        """Served to the end."""
        return self.status == 200 and self.first_token_s is not None and self.end_s is not None

    @property
    def ttft_s(self) -> float | None:
        """Time to the first output token."""
        return None if self.first_token_s is None else self.first_token_s - self.send_s

    def gaps_s(self) -> list[float]:
        """Gaps between consecutive output chunks."""
        return [b - a for a, b in zip(self.token_s, self.token_s[1:])]

    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if not self.ok or len(self.token_s) < 2:
            return None
        return (self.token_s[-1] - self.token_s[0]) / (len(self.token_s) - 1)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear interpolation; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_summary(records: list[RequestRecord], slo: Slo, span_s: float) -> dict:
    """Latency, goodput and rejection figures of a group of records."""
    served = [r for r in records if r.ok]
    ttfts = [r.ttft_s for r in served]
    gaps = [gap for r in served for gap in r.gaps_s()]
    e2e = [r.end_s - r.send_s for r in served]
    before = [r.dispatched_s - r.send_s for r in served if r.dispatched_s is not None]
    in_engine = [r.engine_start_s - r.dispatched_s for r in served
                 if r.engine_start_s is not None and r.dispatched_s is not None]
    good = [r for r in served if r.ttft_s <= slo.ttft_s.get(r.band, math.inf)
            and (r.tpot_s() or 0.0) <= slo.tpot_s]
    rejected: dict[str, int] = defaultdict(int)
    for r in records:
        if not r.ok:
            rejected[str(r.status)] += 1
    return {
        "requests": len(records), "served": len(served),
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p90_s": percentile(ttfts, 90), "ttft_p99_s": percentile(ttfts, 99),
        "itl_p50_s": percentile(gaps, 50), "itl_p99_s": percentile(gaps, 99),
        "stall_p99_s": percentile([max(r.gaps_s()) for r in served if len(r.token_s) > 1], 99),
        "e2e_p50_s": percentile(e2e, 50), "e2e_p99_s": percentile(e2e, 99),
        "queue_p50_s": percentile(before, 50), "queue_p99_s": percentile(before, 99),
        "engine_queue_p50_s": percentile(in_engine, 50), "engine_queue_p99_s": percentile(in_engine, 99),
        "goodput_rps": len(good) / span_s if span_s > 0 else 0.0,
        "tokens_per_s": sum(r.prompt_tokens + len(r.token_s) for r in served) / span_s if span_s > 0 else 0.0,
        "slo_attainment": len(good) / len(records) if records else None,
        "rejected": dict(rejected),
        "errors": sorted({r.error for r in records if not r.ok and r.error})[:3],
    }


def tail_breakdown(records: list[RequestRecord], share: float = 0.05) -> dict | None:
    """Where the slowest ``share`` of the served requests (by TTFT) spent it: how many ran on each pool,
    and the medians of their wait before the replica and of the time from reaching it to the first token
    (the engine's own queue and the prefill). None when nothing was served."""
    served = sorted((r for r in records if r.ok), key=lambda r: r.ttft_s)
    if not served:
        return None
    tail = served[-max(1, math.ceil(len(served) * share)):]
    placed = [r for r in tail if r.dispatched_s is not None]
    return {
        "requests": len(tail), "ttft_from_s": tail[0].ttft_s,
        "pools": dict(sorted(Counter(r.pool or "?" for r in tail).items())),
        "queue_p50_s": percentile([r.dispatched_s - r.send_s for r in placed], 50),
        "to_first_token_p50_s": percentile([r.first_token_s - r.dispatched_s for r in placed], 50),
    }


def service_events(records: Iterable[RequestRecord]) -> dict[str, list[tuple[float, float]]]:
    """(time, weighted tokens) per tenant: the prompt at the first token, then one per output chunk."""
    events: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        if not r.token_s:
            continue
        events[r.tenant].append((r.token_s[0], (r.prompt_tokens + 1) / r.weight))
        events[r.tenant].extend((t, 1.0 / r.weight) for t in r.token_s[1:])
    return events


def _waiting_intervals(records: Iterable[RequestRecord]) -> dict[str, list[tuple[float, float]]]:
    """Per tenant, when it had a request sent but not yet started (merged intervals)."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        start = next((t for t in (r.engine_start_s, r.first_token_s, r.end_s) if t is not None), r.send_s)
        if start > r.send_s:
            spans[r.tenant].append((r.send_s, start))
    merged: dict[str, list[tuple[float, float]]] = {}
    for tenant, items in spans.items():
        items.sort()
        out = [list(items[0])]
        for a, b in items[1:]:
            if a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        merged[tenant] = [(a, b) for a, b in out]
    return merged


def _covered(intervals: list[tuple[float, float]], a: float, b: float) -> bool:
    return any(x <= a and b <= y for x, y in intervals)


def _jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def fair_shares(demands: list[float], capacity: float) -> list[float]:
    """Max-min fair shares of ``capacity`` (water-filling): no one gets more than its demand, and what one
    does not use goes to the others equally."""
    shares = [0.0] * len(demands)
    left, open_ = capacity, sorted(range(len(demands)), key=lambda i: demands[i])
    while open_:
        level = left / len(open_)
        i = open_[0]
        if demands[i] > level:
            for j in open_:
                shares[j] = level
            break
        shares[i] = demands[i]
        left -= demands[i]
        open_.pop(0)
    return shares


def _waiting_at(records: Iterable[RequestRecord], t: float) -> dict[str, float]:
    """Weighted tokens per tenant of the requests sent by ``t`` and not yet started then."""
    waiting: dict[str, float] = defaultdict(float)
    for r in records:
        start = next((x for x in (r.engine_start_s, r.first_token_s, r.end_s) if x is not None), r.send_s)
        if r.send_s <= t < start:
            waiting[r.tenant] += (r.prompt_tokens + r.output_tokens) / r.weight
    return waiting


def fairness(records: list[RequestRecord], window_s: float, span_s: float) -> dict:
    """Jain's index over windows (backlogged tenants only), against fair shares and plain, and the largest
    weighted service gap."""
    events = service_events(records)
    waiting = _waiting_intervals(records)
    tenants = sorted(events)
    windows = max(1, math.ceil(span_s / window_s))
    per_window = [[0.0] * len(tenants) for _ in range(windows)]
    for i, tenant in enumerate(tenants):
        for t, amount in events[tenant]:
            per_window[min(windows - 1, int(t / window_s))][i] += amount
    indices, plain, least = [], [], []
    gap = 0.0
    for w, served in enumerate(per_window):
        a, b = w * window_s, (w + 1) * window_s
        backlogged = [i for i, tenant in enumerate(tenants) if _covered(waiting.get(tenant, []), a, b)]
        if len(backlogged) >= 2:
            xs = [served[i] for i in backlogged]
            if sum(xs) > 0:
                left = _waiting_at(records, b)
                shares = fair_shares([served[i] + left.get(tenants[i], 0.0) for i in backlogged], sum(xs))
                ratios = [x / share for x, share in zip(xs, shares) if share > 0]
                indices.append(_jain(ratios))
                least.append(min(ratios))
                plain.append(_jain(xs))
    # largest gap: over runs of consecutive windows where a pair stayed backlogged, the extreme of the
    # running difference of their weighted service
    for i in range(len(tenants)):
        for j in range(i + 1, len(tenants)):
            difference, low, high = 0.0, 0.0, 0.0
            for w, served in enumerate(per_window):
                a, b = w * window_s, (w + 1) * window_s
                if (_covered(waiting.get(tenants[i], []), a, b) and _covered(waiting.get(tenants[j], []), a, b)):
                    difference += served[i] - served[j]
                    low, high = min(low, difference), max(high, difference)
                    gap = max(gap, high - low)
                else:
                    difference, low, high = 0.0, 0.0, 0.0
    return {
        "jain_min": min(indices) if indices else None,
        "jain_mean": sum(indices) / len(indices) if indices else None,
        "fair_share_min": min(least) if least else None,
        "jain_plain_min": min(plain) if plain else None,
        "windows_compared": len(indices),
        "max_weighted_gap_tokens": gap,
    }


def write_records(path: Path, records: list[RequestRecord]) -> None:
    """Write ``records`` to ``path``, one JSON object a line (what the client saw of each request)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(record)) + "\n" for record in records))


def summarise(records: list[RequestRecord], slo: Slo, window_s: float) -> dict:
    """All figures of one system on one scenario: overall, per band, per tenant, fairness."""
    span = max((r.end_s or r.send_s for r in records), default=0.0)
    by_band: dict[str, list[RequestRecord]] = defaultdict(list)
    by_tenant: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        by_band[r.band].append(r)
        by_tenant[r.tenant].append(r)
    return {
        "span_s": span,
        "overall": latency_summary(records, slo, span),
        "bands": {band: latency_summary(rs, slo, span) for band, rs in sorted(by_band.items())},
        "tenants": {tenant: latency_summary(rs, slo, span) for tenant, rs in sorted(by_tenant.items())},
        "tails": {band: tail_breakdown(rs) for band, rs in sorted(by_band.items())},
        "fairness": fairness(records, window_s, span),
    }
