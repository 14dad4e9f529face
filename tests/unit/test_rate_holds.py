"""A tenant the queue holds back is refused 429 from its headers until the time the queue named."""

import pytest

from gateway.errors import RateLimited
from gateway.rate_holds import KEPT_TENANTS, RateHolds
from tests.support.clock import ManualClock


def test_a_held_tenant_is_refused_until_the_time_the_queue_named() -> None:
    clock = ManualClock()
    holds = RateHolds(clock)
    holds.check("acme")  # nothing held
    holds.hold("acme", 2.2)
    with pytest.raises(RateLimited) as caught:
        holds.check("acme")
    assert caught.value.status == 429 and caught.value.headers["Retry-After"] == "3"
    holds.check("other")  # per tenant
    clock.now += 2.0
    with pytest.raises(RateLimited) as caught:
        holds.check("acme")
    assert caught.value.headers["Retry-After"] == "1"  # never 0
    clock.now += 0.2
    holds.check("acme")  # the hold is over
    holds.hold("acme", 0)  # "a smaller request could pass now": nothing held
    holds.check("acme")


def test_the_holds_kept_are_bounded() -> None:
    holds = RateHolds(ManualClock())
    for i in range(KEPT_TENANTS + 10):
        holds.hold(f"t{i}", 60)
    holds.check("t0")  # the oldest were forgotten
    with pytest.raises(RateLimited):
        holds.check(f"t{KEPT_TENANTS + 9}")
