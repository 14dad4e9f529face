"""Replica placement: which replica a granted ticket runs on.

Among replicas that fit the ticket (accept its length class, have a free slot and enough free tokens),
a replica whose pool *prefers* the ticket's length class wins (long prompts go to the pool with the large
chunked-prefill budget, where their prefill stalls no latency-sensitive decode; short ones to the pool with
the small budget); the others take the ticket only when no preferring replica has room (spill-over onto
free capacity). Then the most free slots wins, then the most free tokens, then the smallest id: spreading
load keeps batches small, which keeps inter-token latency low. The Lua dispatch applies the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from policies.types import ReplicaCapacity


def choose_replica(replicas: Iterable[ReplicaCapacity], cost: int, length_class: str) -> ReplicaCapacity | None:
    """The best replica for a ticket of ``cost`` tokens and ``length_class``, or None if none fits now."""
    best: ReplicaCapacity | None = None
    for replica in replicas:
        if not replica.fits(cost, length_class):
            continue
        if best is None or _rank(replica, length_class) < _rank(best, length_class):
            best = replica
    return best


def _rank(replica: ReplicaCapacity, length_class: str) -> tuple[bool, int, int, str]:
    return (length_class not in replica.prefers, -replica.slots_free, -replica.tokens_free, replica.replica_id)


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
