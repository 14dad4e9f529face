"""Placement: which open replica a ticket runs on, as filter -> scorer -> picker. Mirrored by
``fleet/lua/placement.lua``.

* **Filter** (:func:`fits`): the replica runs the ticket's length class and has the tokens for it (an
  idle replica takes any ticket it accepts, so a request larger than any budget still runs, alone). A
  *guarded* class (:func:`guarded_classes`: longer than anything the replica's pool is built for) is taken
  only by a replica that holds none of the work it is built for, and only while what it has not started
  fits in one step (:func:`takes_guarded`): a latency replica with no short request of its own prefills
  long prompts, chunked under its small step budget, and goes back to short work once they end. Pool
  preference stays a preference, and no replica idles while a ticket it accepts waits -- except under a
  pool's ``reserve`` (:func:`keeps_reserve`): that many replicas of its group stay empty while others take
  guarded work, so a burst of the pool's own work always finds one whose steps no long prompt lengthens.
* **Scorer** (:func:`rank`, lower is better): a replica whose pool prefers the class first (a pool that
  names no preference prefers all it accepts), then one holding no guarded work (short requests keep away
  from the replicas prefilling long prompts, whose steps those prompts lengthen, while another replica can
  take them), then the least pending work (new work goes where it starts soonest), then the most free
  slots, the smallest id. While a replica of its group holds guarded work, the group *packs* the work it
  is built for (:class:`GroupLoad`): the fewest free slots come first instead, so short work runs on as few
  replicas as it needs, and the rest stay free to prefill long prompts at their guarded step. While none
  does, short work spreads, and every step stays small.
* **Picker** (:func:`choose_replica`): the best-ranked replica that passes the filter.

So the latency pool splits itself by demand: the replicas serving short requests keep their steps short,
and the rest prefill long prompts until short work needs them again.

The gate (:mod:`policies.gate`) decides beforehand which replicas are open to the ticket's band.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from policies.gate import pending
from policies.types import ReplicaCapacity


def guarded_classes(accepts: Iterable[str], prefers: Iterable[str], order: Sequence[str]) -> frozenset[str]:
    """The accepted classes a pool takes only when idle: those longer than every class it prefers
    (``order``: the length classes, shortest first). A pool that prefers nothing guards nothing."""
    preferred = [order.index(c) for c in prefers if c in order]
    if not preferred:
        return frozenset()
    return frozenset(c for c in accepts if c in order and order.index(c) > max(preferred))


def prefers(replica: ReplicaCapacity, length_class: str) -> bool:
    """True when ``replica``'s pool is built for the class (a pool that prefers nothing is built for all)."""
    return not replica.prefers or length_class in replica.prefers


def takes_guarded(replica: ReplicaCapacity) -> bool:
    """True when ``replica`` may take work of a class it guards: it holds none of the work its pool is built
    for, and what it has not started fits in one step."""
    return not replica.holds_own_work and pending(replica) <= replica.step_tokens


Group = tuple[frozenset[str], frozenset[str], frozenset[str]]


def group_of(replica: ReplicaCapacity) -> Group:
    """The replica's placement group: the replicas that accept, prefer and guard the same classes."""
    return replica.accepts, replica.prefers, replica.guarded


@dataclass(frozen=True)
class GroupLoad:
    """What placement needs of a whole placement group: its ``spare`` replicas (holding no work at all: the
    pool's reserve counts these), and whether it ``packs`` the work it is built for (a replica of it holds
    guarded work)."""

    spare: int = 0
    packs: bool = False


def group_loads(replicas: Iterable[ReplicaCapacity]) -> dict[Group, GroupLoad]:
    """Each placement group's :class:`GroupLoad`, over ``replicas`` (every registered replica)."""
    spare: dict[Group, int] = {}
    packs: dict[Group, bool] = {}
    for replica in replicas:
        group = group_of(replica)
        spare[group] = spare.get(group, 0) + (replica.slots_free == replica.slots_total)
        packs[group] = packs.get(group, False) or replica.guarded_held > 0
    return {group: GroupLoad(spare[group], packs[group]) for group in spare}


def keeps_reserve(replica: ReplicaCapacity, spare_in_group: int) -> bool:
    """True when taking guarded work leaves ``replica``'s group its reserve of empty replicas (one already
    holding guarded work changes nothing; without a reserve there is nothing to keep)."""
    return replica.guarded_held > 0 or replica.reserve == 0 or spare_in_group - 1 >= replica.reserve


def fits(replica: ReplicaCapacity, cost: int, length_class: str, load: GroupLoad | None = None) -> bool:
    """Filter: True when ``replica`` may run a ticket of this cost and class (``load``: its group's; None:
    no reserve is checked)."""
    if length_class not in replica.accepts:
        return False
    if length_class in replica.guarded and not takes_guarded(replica):
        return False
    if length_class in replica.guarded and load is not None and not keeps_reserve(replica, load.spare):
        return False
    return replica.tokens_free >= cost or replica.slots_free == replica.slots_total


def rank(replica: ReplicaCapacity, length_class: str, packs: bool = False) -> tuple[bool, bool, int, int, str]:
    """Scorer: the replica's rank for the class (lower is better; ``packs``: its group packs the work it is
    built for, which puts the fewest free slots first for a class it does not guard)."""
    packed = packs and length_class not in replica.guarded
    return (not prefers(replica, length_class), replica.guarded_held > 0, pending(replica),
            replica.slots_free if packed else -replica.slots_free, replica.replica_id)


def choose_replica(candidates: Iterable[ReplicaCapacity], cost: int, length_class: str,
                   loads: dict[Group, GroupLoad] | None = None) -> ReplicaCapacity | None:
    """Picker: the best open replica for a ticket of ``cost`` tokens and ``length_class``, or None
    (``loads``: :func:`group_loads` of every registered replica, for the pools' reserves and packing)."""
    best: ReplicaCapacity | None = None
    best_rank = None
    for replica in candidates:
        load = None if loads is None else loads.get(group_of(replica), GroupLoad())
        if fits(replica, cost, length_class, load):
            replica_rank = rank(replica, length_class, load is not None and load.packs)
            if best_rank is None or replica_rank < best_rank:
                best, best_rank = replica, replica_rank
    return best


def pool_for_class(pools: Sequence[tuple[str, Sequence[str], Sequence[str]]], length_class: str) -> str:
    """Without the global queue: the first pool (name, accepts, prefers) preferring the class, else the
    first accepting it. Load is then left to Ray Serve's router inside that pool."""
    for name, _, prefers_ in pools:
        if length_class in prefers_:
            return name
    for name, accepts, _ in pools:
        if length_class in accepts:
            return name
    raise ValueError(f"no pool accepts length class {length_class!r}")
