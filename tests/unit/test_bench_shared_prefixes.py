"""Scenarios whose tenants share prompt prefixes: the workload, the prompts the client sends, and which
systems run them (the prefix-aware baseline only there, and only on real engines)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.__main__ import _runs
from bench.prompts import Prompts
from bench.systems import PREFIX_AWARE, SYSTEMS, systems_for
from bench.workload import Scenario, generate

SCENARIOS = Path(__file__).parents[2] / "bench" / "scenarios"


@pytest.fixture(scope="module")
def shared() -> Scenario:
    return Scenario.load(SCENARIOS / "shared-prefixes.yaml")


def test_requests_of_one_prefix_share_its_length_and_fit_the_context(shared: Scenario) -> None:
    workload = generate(shared, context_tokens=1024)
    by_prefix: dict[str, set[int]] = {}
    for request in workload:
        assert request.prefix_id is not None and request.prefix_id.startswith(f"shared-prefixes-{request.tenant}-")
        assert 0 < request.prefix_tokens < request.prompt_tokens
        assert request.prompt_tokens + request.output_tokens <= 1024
        by_prefix.setdefault(request.prefix_id, set()).add(request.prefix_tokens)
    assert all(len(lengths) == 1 for lengths in by_prefix.values())
    groups = sum(tenant.shared_prefix.groups for tenant in shared.tenants)
    assert len(by_prefix) == groups  # every document and system prompt is asked about more than once
    assert len(workload) > 2 * groups


def test_a_scenario_without_shared_prefixes_keeps_its_workload() -> None:
    steady = Scenario.load(SCENARIOS / "steady.yaml")
    assert not steady.shares_prefixes
    assert all(r.prefix_id is None and r.prefix_tokens == 0 for r in generate(steady))


def test_text_prompts_are_exactly_their_planned_length_and_a_prefix_reads_the_same_everywhere(
        shared: Scenario, tiny_model_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    workload = generate(shared, context_tokens=1024)[:20]
    prompts = Prompts.for_model(tiny_model_path)
    first = prompts.for_workload(workload, random.Random(1))
    again = Prompts.for_model(tiny_model_path).for_workload(workload, random.Random(2))
    for request in workload:
        text = first[request.request_id]
        assert isinstance(text, str)
        assert len(tokenizer(text, add_special_tokens=False).input_ids) == request.prompt_tokens
        words = request.prefix_tokens  # one token per word, each word opening with its space
        prefix = "".join(text.split(" ")[1:words + 1])
        assert prefix == "".join(again[request.request_id].split(" ")[1:words + 1])
        assert text != again[request.request_id]  # the rest is fresh per run
    one, other = (next(r for r in workload if r.prefix_id == p) for p in sorted({r.prefix_id for r in workload})[:2])
    assert first[one.request_id][:200] != first[other.request_id][:200]


def test_a_workload_without_prefixes_gets_random_token_ids(tiny_model_path: Path) -> None:
    workload = generate(Scenario.load(SCENARIOS / "steady.yaml"))[:5]
    prompts = Prompts.for_model(tiny_model_path).for_workload(workload, random.Random(3))
    vocab = Prompts.for_model(tiny_model_path).vocab
    for request in workload:
        ids = prompts[request.request_id]
        assert isinstance(ids, list) and len(ids) == request.prompt_tokens and max(ids) < vocab


def test_the_prefix_aware_baseline_runs_only_where_prefixes_are_shared_and_cached(shared: Scenario) -> None:
    everything = list(SYSTEMS)
    assert systems_for(True, everything, real_engines=True) == everything
    assert PREFIX_AWARE not in systems_for(False, everything, real_engines=True)
    assert systems_for(True, everything, real_engines=False) == []  # no prefix cache is simulated
    steady = Scenario.load(SCENARIOS / "steady.yaml")
    assert [system for _, system, _ in _runs(steady, everything, False, True)] == [
        s for s in SYSTEMS if s != PREFIX_AWARE]
    assert PREFIX_AWARE in [system for _, system, _ in _runs(shared, everything, False, True)]
    assert _runs(shared, everything, True, False) == []
