"""The gate: whether a replica may be granted more work now. Mirrored by ``fleet/lua/gate.lua``.

A replica the gate closes gets no grant, whatever waits; dispatch stops once it closes every replica, and
the backlog stays in the global queue, where band order and fairness apply. Today the gate opens while the
replica has a free sequence slot.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies.types import ReplicaCapacity


def gate_open(replica: ReplicaCapacity) -> bool:
    """True when ``replica`` may take another grant now."""
    return replica.slots_free >= 1


def open_replicas(replicas: Iterable[ReplicaCapacity]) -> list[ReplicaCapacity]:
    """The replicas the gate leaves open (placement chooses among them)."""
    return [replica for replica in replicas if gate_open(replica)]
