"""The step an engine runs, from the work it holds: its pool's own budget while any request of the classes
its pool is built for is in the engine, a larger one while it holds only guarded work.

A latency replica takes long prompts only while it holds no short work (:mod:`policies.placement`). Under
its own small budget it prefilled them at about 74% of a throughput replica's rate (simulated), so a long
-prompt tenant waited longer than with the baseline. While it holds only long prompts there is no short
stream to stall, so it steps as a throughput replica does; as soon as a short request enters the engine
the budget falls back, and that request waits at most for the one large step already under way. The
engine is started (and its memory sized) for the larger budget.

Used by the vLLM scheduler (:mod:`replicas.step_budget`) and by the simulated engine alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from policies.placement import guarded_classes


@dataclass(frozen=True)
class StepBudget:
    """One engine's two steps: its own, and the one it runs while holding only guarded work."""

    step_tokens: int  # the pool's budget per step
    prefill_chunk: int  # most prompt tokens one request takes of it (0: no cap)
    guarded_step_tokens: int  # the budget while every request it holds is guarded work
    guarded_prefill_chunk: int  # the cap then (0: no cap)
    own_max_prompt_tokens: int  # a request of at most this many prompt tokens is the pool's own work

    def for_prompts(self, prompt_tokens: Iterable[int]) -> tuple[int, int]:
        """(budget, prefill chunk) for the next step of an engine holding requests of these prompt lengths."""
        held = False
        for tokens in prompt_tokens:
            if tokens <= self.own_max_prompt_tokens:
                return self.step_tokens, self.prefill_chunk
            held = True
        if held:
            return self.guarded_step_tokens, self.guarded_prefill_chunk
        return self.step_tokens, self.prefill_chunk


def step_budget(step_tokens: int, prefill_chunk: int, guarded_step_tokens: int | None, guarded_prefill_chunk: int,
                own_max_prompt_tokens: int | None) -> StepBudget | None:
    """An engine's two steps, when it has a guarded step and guards classes (``own_max_prompt_tokens``: the
    longest prompt of its pool's own work; None: it guards none); else None (one step)."""
    if guarded_step_tokens is None or own_max_prompt_tokens is None:
        return None
    return StepBudget(step_tokens, prefill_chunk, guarded_step_tokens, guarded_prefill_chunk, own_max_prompt_tokens)


def own_prompt_limit(accepts: Iterable[str], prefers: Iterable[str],
                     classes: Sequence[tuple[str, int | None]]) -> int | None:
    """The longest prompt of the work a pool is built for, when it guards a longer class (``classes``: each
    length class's name and longest prompt, shortest first); None when it guards none."""
    order = [name for name, _ in classes]
    if not guarded_classes(accepts, prefers, order):
        return None
    return classes[max(order.index(c) for c in prefers if c in order)][1]
