"""A crowded gateway replica: no tenant beyond an even split, a newcomer always gets in while a slot is free,
and the count of open requests is exact however requests end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import TooManyOpenRequests
from gateway.open_requests import RETRY_AFTER_S, OpenRequests
from policies.open_share import crowded_at, may_open


def test_below_crowded_anyone_opens_more_and_from_there_an_even_split_holds() -> None:
    assert may_open(held=89, open_total=89, tenants_open=1, crowded=90)
    assert not may_open(held=90, open_total=90, tenants_open=1, crowded=90)  # alone: stops at crowded
    assert may_open(held=0, open_total=90, tenants_open=1, crowded=90)  # a newcomer gets in at once
    assert not may_open(held=89, open_total=91, tenants_open=2, crowded=90)  # the flood waits for its split
    assert may_open(held=44, open_total=95, tenants_open=2, crowded=90)  # under its split of 45
    assert not may_open(held=45, open_total=95, tenants_open=2, crowded=90)
    assert may_open(held=0, open_total=5, tenants_open=200, crowded=5)  # the split is never below one


def test_crowded_is_a_share_of_the_slots_and_at_least_one() -> None:
    assert crowded_at(2000, 0.9) == 1800
    assert crowded_at(100, 1.0) == 100
    assert crowded_at(1, 0.5) == 1


def test_a_flood_stops_at_crowded_and_the_next_tenant_gets_the_slots_above_it() -> None:
    requests = OpenRequests(slots=10, crowded_share=0.8)
    flood = [requests.open("flood") for _ in range(8)]
    with pytest.raises(TooManyOpenRequests) as refused:
        requests.open("flood")
    assert refused.value.status == 429 and refused.value.headers["Retry-After"] == str(RETRY_AFTER_S)
    assert refused.value.code == "too_many_open_requests"
    calm = [requests.open("calm"), requests.open("calm")]  # the two slots above crowded
    assert requests.total == 10 and requests.tenants == 2
    flood.pop()()
    flood.pop()()  # two of the flood's requests end: 8 open, crowded
    with pytest.raises(TooManyOpenRequests):
        requests.open("flood")  # its slots go to the tenant under its split (4 of 8), not to its next request
    calm += [requests.open("calm"), requests.open("calm")]
    flood.pop()()
    flood.pop()()
    with pytest.raises(TooManyOpenRequests):
        requests.open("calm")  # 4 each: the split holds for the newcomer too
    with pytest.raises(TooManyOpenRequests):
        requests.open("flood")
    flood.pop()()  # below crowded: anyone opens more
    flood.append(requests.open("flood"))
    for close in flood + calm:
        close()
    assert requests.total == 0 and requests.tenants == 0


def test_closing_twice_counts_once() -> None:
    requests = OpenRequests(slots=4, crowded_share=1.0)
    close = requests.open("acme")
    other = requests.open("acme")
    close()
    close()
    assert requests.held("acme") == 1 and requests.total == 1
    other()
    assert requests.held("acme") == 0 and requests.tenants == 0


@settings(max_examples=300, deadline=None)
@given(slots=st.integers(1, 40), share=st.floats(0.05, 1.0),
       steps=st.lists(st.tuples(st.booleans(), st.integers(0, 4)), max_size=200))
def test_any_sequence_keeps_the_split_and_admits_a_newcomer_while_a_slot_is_free(
        slots: int, share: float, steps: list[tuple[bool, int]]) -> None:
    """Random opens (as Ray Serve would send them: never past ``slots``) and closes by five tenants."""
    requests = OpenRequests(slots, share)
    crowded = crowded_at(slots, share)
    held: dict[int, list] = {tenant: [] for tenant in range(5)}
    for opening, tenant in steps:
        name = f"t{tenant}"
        if not opening:
            if held[tenant]:
                held[tenant].pop()()
            continue
        if requests.total >= slots:
            continue  # Serve sends a full replica nothing
        mine, before = len(held[tenant]), requests.total
        others = sum(1 for t, closes in held.items() if closes and t != tenant)
        try:
            held[tenant].append(requests.open(name))
            admitted = True
        except TooManyOpenRequests:
            admitted = False
        split = max(1, crowded // (others + 1))
        assert admitted == (before < crowded or mine < split)  # refused only past crowded and at its split
        assert admitted or mine > 0  # a tenant holding nothing is never refused a free slot
        assert requests.total == sum(len(c) for c in held.values())
        assert requests.total <= slots
