"""Fairness between flows: token-weighted virtual token counters (VTC). Mirrored by ``fleet/lua/fairness.lua``.

Each tenant has a counter per band. Active tenants (those with waiting work) are tried smallest counter
first, ties to the smallest id, and the first one with a ticket that can be placed goes. A grant charges
``cost / weight`` at once (``cost``: the prompt and the output expected); a request that runs past its
estimate is topped up to what its engine has served as its replica reports progress (:func:`top_up`, at most
every ``progress_interval``), so no request looks cheap while it runs longer than it said; completion
corrects the charge to ``actual / weight``. A tenant that becomes active is lifted to the smallest active
counter, or to the band's virtual time (the counter of the last tenant granted) when none is active, so idle
time banks no credit. Hence the counters of active tenants stay within one weighted request cost of each
other, and two continuously backlogged tenants' weighted service differs by at most 2x the largest weighted
cost (a request's cost: its estimate, and what it is topped up by in one report).

Flows inside a tenant (the fairness id a client may send) get a second, unweighted level with the same
rules (tried in counter order). A flow's counter lives only while the flow has waiting work (an idle flow
banks nothing, and no client's stream of fresh ids grows the state), and a tenant has at most ``max_flows``
waiting flows in a band: a ticket of a further flow joins the shared overflow flow (:data:`OVERFLOW_FLOW`).

The functions take the counters as plain mappings: the state is the caller's (Redis, or the reference).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


OVERFLOW_FLOW = "~"  # never a client's fairness id (the gateway allows no "~" in one)


def flow_of(asked: str, waiting_flows: Iterable[str], max_flows: int) -> str:
    """The flow a ticket joins: the one it asked for, unless that would be one waiting flow too many."""
    waiting = set(waiting_flows)
    return asked if asked in waiting or len(waiting) < max_flows else OVERFLOW_FLOW


def lifted(own: float, active: Iterable[float], idle_floor: float) -> float:
    """The counter a member starts its busy period with: its own, raised to the least active one."""
    floor = min(active, default=idle_floor)
    return max(own, floor)


def in_order(counters: Mapping[str, float], members: Iterable[str]) -> list[str]:
    """``members`` least served first (ties: smallest id)."""
    return sorted(members, key=lambda member: (counters[member], member))


def grant_charge(cost: int, weight: float) -> float:
    """What a grant adds to its tenant's counter."""
    return cost / weight


def completion_correction(actual: int, charged: int, weight: float) -> float:
    """What completion adds to the tenant's counter, so it was charged ``actual`` in the end (``charged``: its
    estimate and any top-ups so far)."""
    return (actual - charged) / weight


def top_up(served: int, charged: int) -> int:
    """Tokens to charge a running request whose engine has served ``served`` so far, against the ``charged``
    it has paid: what it ran past its estimate (never a refund before it ends)."""
    return max(0, served - charged)
