"""Placement: which open replica a ticket runs on, as filter -> scorer -> picker. Mirrored by
``fleet/lua/placement.lua``.

* **Filter** (:func:`fits`): the replica runs the ticket's length class and has the tokens for it (an
  idle replica takes any ticket it accepts, so a request larger than any budget still runs, alone).
* **Scorer** (:func:`rank`, lower is better): a replica whose pool *prefers* the class first (long prompts
  go to the pool with the large chunked-prefill budget, where their prefill stalls no latency-sensitive
  decode; short ones to the small budget), the others only when no preferring replica has room
  (spill-over); then the most free slots, the most free tokens, the smallest id: spreading load keeps
  batches small, which keeps inter-token latency low.
* **Picker** (:func:`choose_replica`): the best-ranked replica that passes the filter.

The gate (:mod:`policies.gate`) decides beforehand which replicas are open at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from policies.types import ReplicaCapacity


def fits(replica: ReplicaCapacity, cost: int, length_class: str) -> bool:
    """Filter: True when ``replica`` may run a ticket of this cost and class."""
    if length_class not in replica.accepts:
        return False
    return replica.tokens_free >= cost or replica.slots_free == replica.slots_total


def rank(replica: ReplicaCapacity, length_class: str) -> tuple[bool, int, int, str]:
    """Scorer: the replica's rank for the class (lower is better)."""
    return (length_class not in replica.prefers, -replica.slots_free, -replica.tokens_free, replica.replica_id)


def choose_replica(candidates: Iterable[ReplicaCapacity], cost: int, length_class: str) -> ReplicaCapacity | None:
    """Picker: the best open replica for a ticket of ``cost`` tokens and ``length_class``, or None."""
    best: ReplicaCapacity | None = None
    for replica in candidates:
        if fits(replica, cost, length_class) and (best is None or rank(replica, length_class) < rank(best, length_class)):
            best = replica
    return best


def pool_for_class(pools: Sequence[tuple[str, Sequence[str], Sequence[str]]], length_class: str) -> str:
    """Without the global queue: the first pool (name, accepts, prefers) preferring the class, else the
    first accepting it. Load is then left to Ray Serve's router inside that pool."""
    for name, _, prefers in pools:
        if length_class in prefers:
            return name
    for name, accepts, _ in pools:
        if length_class in accepts:
            return name
    raise ValueError(f"no pool accepts length class {length_class!r}")
