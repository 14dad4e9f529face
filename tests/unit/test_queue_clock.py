"""The queue's clock (policies/clock.py): the wall clock, never backwards, a step at most half a lease."""

from __future__ import annotations

from policies.clock import max_step_ms, queue_time


def test_the_first_call_takes_the_wall_clock() -> None:
    assert queue_time(None, None, 5_000, 500) == 5_000


def test_normal_steps_follow_the_wall_clock() -> None:
    assert queue_time(1_000, 900, 1_400, 500) == 1_300


def test_a_forward_jump_counts_at_most_the_step_limit() -> None:
    assert queue_time(1_000, 900, 601_000, 500) == 1_400


def test_a_backward_step_holds_the_clock() -> None:
    assert queue_time(1_000, 900, 100, 500) == 900


def test_the_step_limit_is_half_a_lease() -> None:
    assert max_step_ms(15_000) == 7_500 and max_step_ms(1) == 1
