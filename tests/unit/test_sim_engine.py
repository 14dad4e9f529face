"""The simulated engine schedules as vLLM V1 does: decodes first, a bounded step budget, chunked prefill."""

from __future__ import annotations

from replicas.sim_engine import SimEngine, SimEngineSettings, SimRequest, StepCostModel, simulate_alone

COST = StepCostModel(base_s=0.001, per_token_s=0.0001, per_seq_s=0.0)


def _engine(**settings) -> SimEngine:
    return SimEngine(SimEngineSettings(**settings), COST)


def test_decodes_go_first_and_a_long_prefill_is_chunked_to_the_budget() -> None:
    engine = _engine(max_num_batched_tokens=128, max_num_seqs=8)
    decoders = [SimRequest(f"d{i}", prompt_tokens=4, output_tokens=50) for i in range(4)]
    for request in decoders:
        engine.add(request)
    engine.finish_step(engine.plan_step())  # their prefills: each emits its first token
    assert all(r.generated == 1 for r in decoders)
    engine.add(SimRequest("long", prompt_tokens=1000, output_tokens=4))
    plan = engine.plan_step()
    assert [(r.request_id, tokens) for r, tokens in plan.work] == [
        ("d0", 1), ("d1", 1), ("d2", 1), ("d3", 1), ("long", 124)]
    assert abs(plan.duration_s - (0.001 + 128 * 0.0001)) < 1e-12
    outcome = engine.finish_step(plan)
    assert {r.request_id for r in outcome.emitted} == {"d0", "d1", "d2", "d3"}  # no token for a partial prefill


def test_per_request_threshold_caps_a_chunk_unless_the_request_is_alone() -> None:
    engine = _engine(max_num_batched_tokens=2048, long_prefill_token_threshold=64)
    engine.add(SimRequest("long", prompt_tokens=1000, output_tokens=1))
    assert engine.plan_step().work[0][1] == 1000  # vLLM 0.32 lifts the cap for a lone request
    engine.add(SimRequest("other", prompt_tokens=1000, output_tokens=1))
    assert [tokens for _, tokens in engine.plan_step().work] == [64, 64]


def test_priority_policy_admits_lower_values_first_fcfs_by_arrival() -> None:
    for policy, first in (("priority", "urgent"), ("fcfs", "early")):
        engine = _engine(max_num_batched_tokens=16, max_num_seqs=1, scheduling_policy=policy)
        engine.add(SimRequest("early", prompt_tokens=8, output_tokens=1, priority=2, arrival_s=0.0))
        engine.add(SimRequest("urgent", prompt_tokens=8, output_tokens=1, priority=0, arrival_s=1.0))
        assert engine.plan_step().work[0][0].request_id == first


def test_max_num_seqs_bounds_the_batch_and_everything_finishes() -> None:
    engine = _engine(max_num_batched_tokens=512, max_num_seqs=3)
    requests = [SimRequest(f"r{i}", prompt_tokens=10, output_tokens=5) for i in range(7)]
    for request in requests:
        engine.add(request)
    steps = 0
    while engine.has_work():
        plan = engine.plan_step()
        assert len(plan.work) <= 3
        engine.finish_step(plan)
        steps += 1
    assert all(r.finished for r in requests) and steps == 15  # 3 waves of 5 steps


def test_aborted_requests_leave_at_the_next_step() -> None:
    engine = _engine()
    engine.add(SimRequest("a", prompt_tokens=10, output_tokens=100))
    engine.add(SimRequest("b", prompt_tokens=10, output_tokens=2))
    engine.finish_step(engine.plan_step())
    engine.abort("a")
    assert [r.request_id for r, _ in engine.plan_step().work] == ["b"]


def test_simulate_alone_adds_up_step_times() -> None:
    seconds = simulate_alone(_engine(max_num_batched_tokens=100), [SimRequest("x", 250, 3)])
    # prefill 100 + 100 + 50 (the last also emits token 1), then 2 decode steps
    assert abs(seconds - (5 * 0.001 + (250 + 2) * 0.0001)) < 1e-9
