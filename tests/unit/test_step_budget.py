"""The step an engine runs by the work it holds (policies/step_budget.py), as the settings, the vLLM
command line and the simulated engine take it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from policies.step_budget import StepBudget, own_prompt_limit
from replicas.engine_settings import EngineSettings
from replicas.sim_engine import CPU_TINY_MODEL, SimEngine, SimEngineSettings, SimRequest

BUDGET = StepBudget(step_tokens=1024, prefill_chunk=512, guarded_step_tokens=8192, guarded_prefill_chunk=4096,
                    own_max_prompt_tokens=2048)
CLASSES = [("short", 2048), ("long", None)]


def test_one_request_of_its_own_work_keeps_the_small_step() -> None:
    assert BUDGET.for_prompts([9000, 16000]) == (8192, 4096)
    assert BUDGET.for_prompts([9000, 2048, 16000]) == (1024, 512)  # the limit itself is own work
    assert BUDGET.for_prompts([]) == (1024, 512)


def test_only_a_pool_that_guards_a_longer_class_has_an_own_limit() -> None:
    assert own_prompt_limit(["short", "long"], ["short"], CLASSES) == 2048
    assert own_prompt_limit(["short", "long"], ["long"], CLASSES) is None  # the throughput pool guards nothing
    assert own_prompt_limit(["short"], ["short"], CLASSES) is None
    assert own_prompt_limit(["short", "long"], [], CLASSES) is None


def test_the_engine_is_started_for_the_larger_step() -> None:
    settings = EngineSettings(max_num_batched_tokens=1024, long_prefill_token_threshold=512, guarded_step_tokens=8192)
    budget = settings.step_budget(2048)
    args = settings.to_cli_args("/m", "m", budget)
    assert args[args.index("--max-num-batched-tokens") + 1] == "8192"
    assert args[args.index("--long-prefill-token-threshold") + 1] == "512"
    assert settings.step_budget(None) is None  # it guards nothing: one step
    plain = settings.to_cli_args("/m", "m")
    assert plain[plain.index("--max-num-batched-tokens") + 1] == "1024"
    with pytest.raises(ValidationError, match="guarded_step_tokens"):
        EngineSettings(max_num_batched_tokens=1024, guarded_step_tokens=512)


def test_the_simulated_engine_steps_the_same_way() -> None:
    settings = SimEngineSettings(max_num_batched_tokens=128, long_prefill_token_threshold=64, guarded_step_tokens=1024,
                                 own_prompt_limit=256)
    engine = SimEngine(settings, CPU_TINY_MODEL)
    engine.add(SimRequest("long", prompt_tokens=1500, output_tokens=2))
    plan = engine.plan_step()
    assert sum(tokens for _, tokens in plan.work) == 1024
    engine.finish_step(plan)
    engine.add(SimRequest("short", prompt_tokens=40, output_tokens=2))
    plan = engine.plan_step()
    assert [(r.request_id, tokens) for r, tokens in plan.work] == [("long", 64), ("short", 40)]


def test_the_engine_gets_the_scheduler_of_its_async_mode() -> None:
    # vLLM's GPU default is its async scheduler, which the CPU build never uses: checked here by its choice
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from replicas.step_budget import CONFIG_KEY, StepsByWorkHeldAsyncScheduler, StepsByWorkHeldScheduler, use_step_budget
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    for async_scheduling, chosen in ((True, StepsByWorkHeldAsyncScheduler), (False, StepsByWorkHeldScheduler)):
        config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_batched_tokens=8192, scheduler_cls=None,
                                                                  async_scheduling=async_scheduling),
                                 additional_config={})
        use_step_budget(config, BUDGET)
        assert resolve_obj_by_qualname(config.scheduler_config.scheduler_cls) is chosen
        assert config.additional_config[CONFIG_KEY]["guarded_step_tokens"] == 8192
    assert issubclass(StepsByWorkHeldAsyncScheduler, AsyncScheduler)
    assert StepsByWorkHeldAsyncScheduler.schedule is StepsByWorkHeldScheduler.schedule  # the same rule in both
    started_small = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_batched_tokens=1024, async_scheduling=False),
                                    additional_config={})
    with pytest.raises(ValueError, match="started for the guarded step"):
        use_step_budget(started_small, BUDGET)
