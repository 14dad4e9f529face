"""The gate: whether a replica may be granted more of a band's work now. Mirrored by ``fleet/lua/gate.lua``.

The queue keeps the backlog itself and releases work to a replica only when the replica can start it
promptly; what waits stays in the global queue, where band order and fairness apply, instead of in the
engine's own queue, where they do not.

* **Pending work** (:func:`pending`) is the prompt tokens the replica has not started: those of the
  requests its engine last reported unstarted (waiting, in transit, or still prefilling), plus those of the
  grants it has not acknowledged yet (the in-flight credit: a grant counts from the moment it is made, so
  late reports cannot overshoot). Each request counts up to the engine's prefill chunk, what it can take
  of one step: a long prompt prefilling on a small-budget replica still leaves room to start others.
* **Current signals** (:func:`gate_open`): the replica is open to a band while it has a free sequence slot,
  its pending work is below the band's ``max_unstarted_steps`` times its engine's step budget (what its
  engine can start in that many steps: a replica with a large budget takes more), and its KV usage is below
  the band's ``kv_ceiling``. Lower bands have lower limits, so they close first and the top band keeps
  headroom; no single limit closes every band at once.
* **Stale signals** (none reported within the stale limit, or never): the concurrency cap alone, a free
  sequence slot; pending work is then the tokens its grants reserve. Late reports never halt dispatch.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies.types import BandPolicy, ReplicaCapacity


def pending(replica: ReplicaCapacity) -> int:
    """Prompt tokens granted to ``replica`` that it has not started (stale signals: every grant's reserve)."""
    if replica.fresh:
        return replica.signals.unstarted_tokens + replica.in_flight_tokens
    return replica.tokens_total - replica.tokens_free


def gate_open(replica: ReplicaCapacity, band: BandPolicy) -> bool:
    """True when ``replica`` may take another ticket of ``band`` now."""
    if replica.slots_free < 1:
        return False
    if not replica.fresh:
        return True
    return (pending(replica) < band.max_unstarted_steps * replica.step_tokens
            and replica.signals.kv_usage < band.kv_ceiling)


def open_replicas(replicas: Iterable[ReplicaCapacity], band: BandPolicy) -> list[ReplicaCapacity]:
    """The replicas the gate leaves open to ``band`` (placement chooses among them)."""
    return [replica for replica in replicas if gate_open(replica, band)]


def is_stale(replica: ReplicaCapacity, now_ms: int, stale_ms: int) -> bool:
    """True when ``replica``'s signals, current until now, are too old to trust from ``now_ms`` on."""
    return replica.fresh and replica.signals_at_ms + stale_ms <= now_ms
