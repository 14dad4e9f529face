"""The gate: whether a replica may be granted more of a band's work now. Mirrored by ``fleet/lua/gate.lua``.

The queue keeps the backlog itself and releases work to a replica only when the replica can start it
promptly; what waits stays in the global queue, where band order and fairness apply, instead of in the
engine's own queue, where they do not.

* **Pending work** (:func:`pending`) is what the replica has not started: the unstarted requests its
  engine last reported (waiting, in transit, or still prefilling), plus the grants it has not acknowledged
  yet (the in-flight credit: a grant counts from the moment it is made, so late reports cannot overshoot).
* **Current signals** (:func:`gate_open`): the replica is open to a band while it has a free sequence slot,
  its pending work is below the band's ``max_unstarted`` and its KV usage below the band's
  ``kv_ceiling``. Lower bands have lower limits, so they close first and the top band keeps headroom; no
  single limit closes every band at once.
* **Stale signals** (none reported within the stale limit, or never): the concurrency cap alone, a free
  sequence slot, and pending work is every grant it holds. Late reports never halt dispatch.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies.types import BandPolicy, ReplicaCapacity


def pending(replica: ReplicaCapacity) -> int:
    """Work granted to ``replica`` that it has not started (with stale signals: every grant it holds)."""
    if replica.fresh:
        return replica.signals.unstarted + replica.in_flight
    return replica.slots_total - replica.slots_free


def gate_open(replica: ReplicaCapacity, band: BandPolicy) -> bool:
    """True when ``replica`` may take another ticket of ``band`` now."""
    if replica.slots_free < 1:
        return False
    if not replica.fresh:
        return True
    return pending(replica) < band.max_unstarted and replica.signals.kv_usage < band.kv_ceiling


def open_replicas(replicas: Iterable[ReplicaCapacity], band: BandPolicy) -> list[ReplicaCapacity]:
    """The replicas the gate leaves open to ``band`` (placement chooses among them)."""
    return [replica for replica in replicas if gate_open(replica, band)]


def is_stale(replica: ReplicaCapacity, now_ms: int, stale_ms: int) -> bool:
    """True when ``replica``'s signals, current until now, are too old to trust from ``now_ms`` on."""
    return replica.fresh and replica.signals_at_ms + stale_ms <= now_ms
