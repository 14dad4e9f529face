"""The live bench's view of where the backlog waited: the gateway's /metrics parsed and summarised."""

from bench.engine_queue import QueueSampler, engine_queue_times, queue_sample, summarise_samples

SCRAPE = """# TYPE fleetgate_band_queue_depth gauge
fleetgate_band_queue_depth{band="interactive"} %d
fleetgate_band_queue_depth{band="batch"} %d
# TYPE fleetgate_replica_engine_waiting gauge
fleetgate_replica_engine_waiting{replica="r1",pool="latency"} %d
fleetgate_replica_engine_waiting{replica="r2",pool="throughput"} 0
# TYPE fleetgate_replica_pending_tokens gauge
fleetgate_replica_pending_tokens{replica="r1",pool="latency"} %d
fleetgate_replica_pending_tokens{replica="r2",pool="throughput"} 0
# TYPE fleetgate_replica_gate_limit_tokens gauge
fleetgate_replica_gate_limit_tokens{replica="r1",pool="latency"} 384
fleetgate_replica_gate_limit_tokens{replica="r2",pool="throughput"} 6144
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{replica="r1",le="0.1"} %d
vllm:request_queue_time_seconds_bucket{replica="r1",le="1.0"} %d
vllm:request_queue_time_seconds_bucket{replica="r1",le="+Inf"} %d
vllm:request_queue_time_seconds_count{replica="r1"} %d
vllm:request_queue_time_seconds_sum{replica="r1"} 1.0
"""


def _scrape(interactive: int, batch: int, waiting: int, pending: int, fast: int, total: int) -> str:
    return SCRAPE % (interactive, batch, waiting, pending, fast, total, total, total)


def test_a_scrape_gives_each_replicas_waiting_and_pending_over_limit_and_the_queue_depth() -> None:
    sample = queue_sample(_scrape(3, 40, 2, 192, 0, 0))
    assert sample == {"engine_waiting": {"r1": 2, "r2": 0}, "pending_over_limit": {"r1": 0.5, "r2": 0.0},
                      "global_depth": 43}


def test_the_summary_keeps_the_worst_and_the_engine_queue_time_between_the_scrapes() -> None:
    samples = [queue_sample(_scrape(0, d, w, p, 0, 0)) for d, w, p in ((10, 1, 100), (50, 4, 500), (20, 2, 300))]
    before = engine_queue_times(_scrape(0, 0, 0, 0, 10, 10))
    after = engine_queue_times(_scrape(0, 0, 0, 0, 100, 200))  # 90 under 0.1 s, 100 between 0.1 and 1 s
    summary = summarise_samples(samples, before, after)
    assert summary["global_depth_max"] == 50 and summary["samples"] == 3
    assert summary["replicas"]["r1"]["engine_waiting_max"] == 4
    assert summary["replicas"]["r1"]["pending_over_limit_max"] == round(500 / 384, 2)
    assert summary["engine_queue_p50_s"] == 1.0 and summary["engine_queue_p99_s"] == 1.0
    assert summarise_samples([], {}, {})["engine_queue_p99_s"] is None


def test_the_sampler_scrapes_in_its_own_process_and_survives_failed_scrapes() -> None:
    import multiprocessing

    scraped = multiprocessing.get_context("fork").Event()
    calls = iter(range(10_000))

    def fetch(url: str) -> str:  # runs in the sampler's process (its own copy of ``calls``)
        call = next(calls)
        if call >= 8:
            scraped.set()
        if call % 2:
            raise OSError("refused")
        return _scrape(1, 2, 3, 96, 5, 5)

    with QueueSampler("http://gateway", period_s=0.01, fetch=fetch) as sampler:
        assert scraped.wait(30)
    assert sampler.samples and all(s["global_depth"] == 3 for s in sampler.samples)
    assert sampler.summary()["replicas"]["r1"]["engine_waiting_max"] == 3


def test_the_report_has_a_row_per_replica_of_each_gateway_system() -> None:
    from bench.report import _queues_table

    samples = [queue_sample(_scrape(0, 7, 2, 384, 0, 0))]
    queues = summarise_samples(samples, {}, engine_queue_times(_scrape(0, 0, 0, 0, 5, 5)))
    table = "\n".join(_queues_table({"systems": {"baseline": {}, "gateway": {"queues": queues}}}))
    rows = [line for line in table.splitlines() if line.startswith("| gateway")]
    assert rows[0] == "| gateway | r1 | 2 / 2 | 1 / 1 | 7 | ≤0.1 s / ≤0.1 s |" and len(rows) == 2
    assert _queues_table({"systems": {"baseline": {}}}) == []


STAGES = """# TYPE fleetgate_request_stage_seconds histogram
fleetgate_request_stage_seconds_bucket{stage="enqueue",le="0.001"} %d
fleetgate_request_stage_seconds_bucket{stage="enqueue",le="0.01"} %d
fleetgate_request_stage_seconds_bucket{stage="enqueue",le="+Inf"} %d
# TYPE fleetgate_first_token_part_seconds histogram
fleetgate_first_token_part_seconds_bucket{part="engine",le="0.01"} %d
fleetgate_first_token_part_seconds_bucket{part="engine",le="1.0"} %d
fleetgate_first_token_part_seconds_bucket{part="engine",le="+Inf"} %d
"""


def test_each_stage_and_first_token_part_gets_its_p50_and_p99_between_the_scrapes() -> None:
    from bench.engine_queue import stage_histograms, stage_quantiles

    before = stage_histograms(STAGES % (10, 10, 10, 0, 0, 0))
    # between the scrapes: 100 enqueues under 1 ms; 98 engine parts under 10 ms and 2 up to 1 s
    after = stage_histograms(STAGES % (110, 110, 110, 98, 100, 100))
    assert stage_quantiles(before, after) == {"enqueue": [0.001, 0.001], "engine": [0.01, 1.0]}
    assert stage_quantiles(after, after) == {}  # nothing new: no row


def test_the_report_shows_the_stages_in_request_order() -> None:
    from bench.report import _stages_table

    queues = {"stages_s": {"engine": [0.01, 1.0], "enqueue": [0.001, 0.0025]}}
    table = _stages_table({"systems": {"baseline": {}, "gateway": {"queues": queues}}})
    assert "| system | enqueue | engine |" in table
    assert "| gateway | ≤1 / ≤2.5 | ≤10 / ≤1000 |" in table
    assert _stages_table({"systems": {"baseline": {}}}) == []
