"""Benchmark building blocks: the seeded workload generator and the figures computed from records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.metrics import (RequestRecord, fair_shares, fairness, percentile, summarise, tail_breakdown,
                           write_records)
from bench.workload import Scenario, generate

SCENARIOS = sorted((Path(__file__).parents[2] / "bench" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_shipped_scenario_is_valid_and_reproducible(path: Path) -> None:
    scenario = Scenario.load(path)
    first, again = generate(scenario), generate(scenario)
    assert first == again and first
    assert all(r.prompt_tokens + r.output_tokens <= scenario.context_tokens for r in first)
    assert [r.send_s for r in first] == sorted(r.send_s for r in first)
    assert all(0 <= r.send_s < scenario.duration_s for r in first)
    assert set(scenario.reference_without) <= {t.id for t in scenario.tenants}


def test_rate_scale_and_context_scale_the_load() -> None:
    scenario = Scenario.load(next(p for p in SCENARIOS if p.stem == "overload"))
    base, double = generate(scenario), generate(scenario, rate_scale=2.0)
    assert 1.7 < len(double) / len(base) < 2.3
    longer = generate(scenario, context_tokens=4 * scenario.context_tokens)
    bulk = [r.prompt_tokens for r in base if r.tenant == "bulk"]
    bulk_long = [r.prompt_tokens for r in longer if r.tenant == "bulk"]
    assert min(bulk_long) >= 4 * min(bulk) - 4


def test_a_dilated_scenario_is_the_same_load_on_slower_engines() -> None:
    scenario = Scenario.load(next(p for p in SCENARIOS if p.stem == "burst"))
    slow = scenario.dilated(10)
    assert slow.slo.ttft_s["interactive"] == 10 * scenario.slo.ttft_s["interactive"]
    assert slow.fairness_window_s == 10 * scenario.fairness_window_s and slow.slo.tpot_s == 10 * scenario.slo.tpot_s
    base, sparse = generate(scenario), generate(slow, rate_scale=0.1, duration_scale=10)
    assert 0.8 < len(sparse) / len(base) < 1.25  # about as many requests, spread over ten times as long
    assert max(r.send_s for r in sparse) > 5 * max(r.send_s for r in base)


def test_percentile_interpolates() -> None:
    assert percentile([], 99) is None
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)


def _record(tenant: str, send: float, tokens: list[float], prompt: int = 9, band: str = "standard") -> RequestRecord:
    record = RequestRecord(f"{tenant}-{send}", tenant, band, 1.0, prompt, len(tokens), send, status=200,
                           first_token_s=tokens[0], token_s=tokens, end_s=tokens[-1])
    return record


def test_fairness_sees_an_even_and_an_uneven_share() -> None:
    # two tenants backlogged from 0 to 10 s; each request served 10 tokens (prompt 9 + first token, no more)
    even = [_record(t, 0.0, [s + 0.5]) for t in ("a", "b") for s in range(10)]
    result = fairness(even, window_s=2.0, span_s=10.5)
    assert result["jain_min"] == pytest.approx(1.0) and result["max_weighted_gap_tokens"] == 0
    uneven = [_record("a", 0.0, [s + 0.5]) for s in range(10)] + [_record("b", 0.0, [10.5])]
    result = fairness(uneven, window_s=2.0, span_s=11.0)
    assert result["jain_min"] == pytest.approx(0.5)  # b got nothing while waiting
    # windows [0,2) .. [6,8) have both waiting throughout: a got 2 requests x 10 tokens in each, b none
    assert result["max_weighted_gap_tokens"] == pytest.approx(80)


def test_fair_shares_give_what_is_asked_and_split_the_rest() -> None:
    assert fair_shares([1.0, 10.0, 10.0], 15.0) == [1.0, 7.0, 7.0]
    assert fair_shares([3.0, 3.0], 10.0) == [3.0, 3.0]  # both satisfied: capacity left over


def test_a_tenant_served_all_it_asked_has_had_its_share() -> None:
    # "b" always has one request waiting (each waits 0.9 s), but is served all it sends; "a" is served more
    a = [_record("a", 0.0, [s / 2 + 0.5], prompt=99) for s in range(20)]
    b = [_record("b", s / 2, [s / 2 + 0.9]) for s in range(20)]
    result = fairness(a + b, window_s=2.0, span_s=10.5)
    assert result["jain_plain_min"] < 0.7  # plain Jain calls it unfair
    # only what "b" still had waiting at a window's end counts as unmet: one or two requests in flight
    assert result["jain_min"] > 0.9 and result["fair_share_min"] >= 0.6


def test_summary_counts_goodput_and_rejections() -> None:
    served = _record("a", 0.0, [0.2, 0.3, 0.4], band="interactive")
    late = _record("a", 0.0, [3.0, 3.1], band="interactive")  # TTFT 3 s > the 1 s objective
    rejected = RequestRecord("r", "a", "interactive", 1.0, 5, 5, 0.0, status=429, end_s=0.1)
    summary = summarise([served, late, rejected], Scenario.load(SCENARIOS[0]).slo, window_s=1.0)
    overall = summary["overall"]
    assert overall["served"] == 2 and overall["rejected"] == {"429": 1}
    assert overall["slo_attainment"] == pytest.approx(1 / 3)
    assert summary["bands"]["interactive"]["ttft_p50_s"] == pytest.approx(1.6)


def test_the_tail_says_which_pool_ran_the_slowest_requests_and_where_their_time_went() -> None:
    fast = [_record("a", 0.0, [0.1 + i / 1000]) for i in range(38)]
    for record in fast:
        record.pool, record.dispatched_s = "latency", 0.01
    slow = [_record("a", 0.0, [2.0]), _record("a", 0.0, [3.0])]  # the slowest 5% of 40: these two
    for record in slow:
        record.pool, record.dispatched_s = "throughput", 0.5
    tail = tail_breakdown(fast + slow)
    assert tail["requests"] == 2 and tail["ttft_from_s"] == pytest.approx(2.0)
    assert tail["pools"] == {"throughput": 2}
    assert tail["queue_p50_s"] == pytest.approx(0.5) and tail["to_first_token_p50_s"] == pytest.approx(2.0)
    assert tail_breakdown([RequestRecord("r", "a", "interactive", 1.0, 5, 5, 0.0, status=429)]) is None


def test_records_are_written_one_json_line_each_and_read_back_whole(tmp_path: Path) -> None:
    records = [_record("a", 0.0, [0.5, 0.6]), _record("b", 0.1, [0.9])]
    path = tmp_path / "records" / "burst--gateway.jsonl"
    write_records(path, records)
    lines = path.read_text().splitlines()
    assert [RequestRecord(**json.loads(line)) for line in lines] == records
