"""vLLM V1 schedulers that pick each step's budget by :class:`policies.step_budget.StepBudget`: the pool's
own budget while a request of its own classes is in the engine, the larger guarded step while it holds only
guarded work (long prompts on a latency replica). The engine runs in a process of its own, so the budget
travels in ``additional_config``; the engine is started for the larger step (its memory and graphs sized for
it), and the budget never exceeds what it was started for.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from policies.step_budget import StepBudget

CONFIG_KEY = "fleetgate_step_budget"


class _StepsByWorkHeld:
    """Before each step, set the budget and prefill chunk for the requests the engine holds."""

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, *args, **kwargs)  # type: ignore[call-arg]
        self._step_budget = StepBudget(**vllm_config.additional_config[CONFIG_KEY])
        self.last_step: tuple[int, int] = (0, 0)  # the budget and chunk of the latest step (tests read it)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        step = self._step_budget.for_prompts(r.num_prompt_tokens for r in self.requests.values())
        self.max_num_scheduled_tokens, self.scheduler_config.long_prefill_token_threshold = step
        self.last_step = step
        return super().schedule(*args, **kwargs)  # type: ignore[misc]


class StepsByWorkHeldScheduler(_StepsByWorkHeld, Scheduler):
    """vLLM's scheduler, stepping by the work it holds."""


class StepsByWorkHeldAsyncScheduler(_StepsByWorkHeld, AsyncScheduler):
    """vLLM's async scheduler (the GPU default), stepping by the work it holds."""


def use_step_budget(vllm_config: Any, budget: StepBudget) -> None:
    """Make the engine of ``vllm_config`` (created for the larger step) pick each step by ``budget``."""
    scheduler_config = vllm_config.scheduler_config
    if budget.guarded_step_tokens > scheduler_config.max_num_batched_tokens:
        raise ValueError("the engine must be started for the guarded step")
    chosen = StepsByWorkHeldAsyncScheduler if scheduler_config.async_scheduling else StepsByWorkHeldScheduler
    scheduler_config.scheduler_cls = f"{chosen.__module__}.{chosen.__qualname__}"
    vllm_config.additional_config[CONFIG_KEY] = asdict(budget)
