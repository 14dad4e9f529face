"""The gateway's own Prometheus metrics (one registry per gateway replica).

Every gateway replica publishes these to Redis (see :mod:`gateway.metrics_board`), so a scrape of any
gateway's ``/metrics`` shows every replica's series, labelled ``gateway``, beside the fleet-wide queue
gauges read from the global queue and every vLLM replica's own ``vllm:*`` metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

# a per-series "_created" gauge doubles what is published and scraped for no use here
disable_created_metrics()

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                 30, 120)
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5)


OTHER_TENANTS = "_other"  # the tenant label of tenants past the limit on label values


class GatewayMetrics:
    """Counters and histograms of one gateway replica. ``tenant_labels=False`` blanks the tenant label; past
    ``max_tenant_labels`` distinct tenants (0: no limit), the others share :data:`OTHER_TENANTS`."""

    def __init__(self, tenant_labels: bool = True, max_tenant_labels: int = 0) -> None:
        self.registry = CollectorRegistry()
        self._tenant_labels = tenant_labels
        self._max_tenant_labels = max_tenant_labels
        self._labelled: set[str] = set()
        r = self.registry
        self.tenants_file_stale = Gauge(
            "fleetgate_tenants_file_stale", "1 while the tenants file on disk failed to load and an older one is in "
            "force (a key revoked in it may still work): fix the file.", registry=self.registry)
        self.header_guard_missing = Gauge(
            "fleetgate_header_guard_missing", "1 when Ray on this gateway's node was started without the header "
            "guard (gateway/http_guard.py): oversized or undecodable headers then reach Ray Serve unchecked.",
            registry=self.registry)
        self.open_requests = Gauge(
            "fleetgate_gateway_open_requests", "Requests open on this gateway replica, waiting in the queue, running "
            "or relaying (Ray Serve holds those over its max_ongoing_requests).", registry=self.registry)
        self.requests = Counter("fleetgate_requests", "Requests answered, by HTTP status.",
                                ["tenant", "band", "status"], registry=r)
        self.rejections = Counter("fleetgate_rejections", "Requests turned away at admission, by reason.",
                                  ["tenant", "band", "reason"], registry=r)
        self.grants = Counter("fleetgate_grants", "Grants received from the global queue.",
                              ["tenant", "band", "length_class", "pool"], registry=r)
        self.capped = Counter("fleetgate_band_capped", "Requests lowered to their tenant's highest band.",
                              ["tenant", "requested", "band"], registry=r)
        self.tokens = Counter("fleetgate_served_tokens", "Prompt + output tokens served (what tenants are charged).",
                              ["tenant", "band"], registry=r)
        self.queue_wait = Histogram("fleetgate_queue_wait_seconds", "Time in the global queue: enqueue to grant.",
                                    ["band"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("fleetgate_time_to_first_token_seconds",
                              "Arrival at the gateway to the first streamed token (queueing included).",
                              ["band"], buckets=LATENCY_BUCKETS, registry=r)
        self.inter_token = Histogram("fleetgate_inter_token_latency_seconds",
                                     "Gap between consecutive streamed chunks, as the gateway relays them.",
                                     ["band"], buckets=TOKEN_GAP_BUCKETS, registry=r)
        self.stage = Histogram("fleetgate_request_stage_seconds",
                               "Where a request's time goes: authorise, parse, count_tokens, enqueue, wait_grant, "
                               "first_token (forward to the engine's first token), relay (first token to the end).",
                               ["stage"], buckets=STAGE_BUCKETS, registry=r)
        self.first_token_part = Histogram(
            "fleetgate_first_token_part_seconds",
            "The parts of first_token, from the replica call to its reply's header: serve_hops (Ray Serve's hops to "
            "the replica and back), grant_check, render (vLLM's serving layer), engine (to its first token).",
            ["part"], buckets=STAGE_BUCKETS, registry=r)
        self.loop_lag = Histogram("fleetgate_event_loop_lag_seconds",
                                  "How late this gateway's event loop wakes a 50 ms sleeper: CPU starvation or a "
                                  "blocking call (P99 above ~20 ms: the gateway, not the engines, is the limit).",
                                  buckets=LOOP_LAG_BUCKETS, registry=r)
        self.duration = Histogram("fleetgate_request_duration_seconds", "Arrival to the last byte of the reply.",
                                  ["band"], buckets=LATENCY_BUCKETS, registry=r)

    def tenant(self, tenant_id: str) -> str:
        """The tenant label value: blank when tenant labels are off, shared past the limit on label values."""
        if not self._tenant_labels:
            return ""
        if tenant_id in self._labelled:
            return tenant_id
        if self._max_tenant_labels and len(self._labelled) >= self._max_tenant_labels:
            return OTHER_TENANTS
        self._labelled.add(tenant_id)
        return tenant_id

    def observe_stream(self, band: str, arrived: float, chunk_times: list[float]) -> None:
        """TTFT and inter-token gaps of one streamed reply (monotonic times of its content chunks)."""
        if not chunk_times:
            return
        self.ttft.labels(band).observe(chunk_times[0] - arrived)
        gaps = self.inter_token.labels(band)
        for earlier, later in zip(chunk_times, chunk_times[1:]):
            gaps.observe(later - earlier)
