"""Plain value types shared by the policies, the Redis queue and the simulator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True)
class BandPolicy:
    """One priority band. Bands are strict: a lower-ranked band runs only when no higher one can.

    ``aging_ms`` is the starvation guard: a ticket that has waited that long in this band is promoted to
    the band above (and may be promoted again from there). 0 disables aging for the band.

    ``max_unstarted_steps`` and ``kv_ceiling`` are the band's gate (:mod:`policies.gate`): a replica whose
    engine reports current signals takes this band's tickets only while its unstarted prompt tokens are below
    that many of its engine steps' token budgets, and its KV-cache usage below the ceiling. Lower bands get
    lower values, so the top band always finds headroom.
    """

    name: str
    aging_ms: int = 0
    max_queued: int = 10_000
    max_queued_tokens: int = 10_000_000
    max_unstarted_steps: float = 3.0
    kv_ceiling: float = 1.0
    tenant_share: float = 1.0
    """The most of ``max_queued`` and ``max_queued_tokens`` one tenant may hold waiting: one tenant's flood
    cannot fill the band and lock every other tenant out of it."""


@dataclass(frozen=True)
class TicketSpec:
    """What the queue knows of a request: never its prompt, only who, how urgent, how big, which class."""

    ticket_id: str
    tenant: str
    band: str
    cost: int
    weight: float = 1.0
    length_class: str = "short"
    owner: str = ""
    flow: str = ""
    """A sub-tenant flow (``x-gateway-inference-fairness-id``): flows share their tenant's share fairly."""
    prompt_tokens: int = 0
    """The prompt's tokens (what the engine must prefill before it starts); 0: take ``cost``."""
    ceiling: str = ""
    """The highest band aging may lift it into (its tenant's allowance); "": any band."""

    @property
    def prefill_tokens(self) -> int:
        """The work the gate counts for this ticket until its replica reports it started."""
        return self.prompt_tokens or self.cost


@dataclass(frozen=True)
class Grant:
    """The queue's decision: this ticket runs now on this replica."""

    ticket_id: str
    replica_id: str
    band: str
    tenant: str
    pool: str = "default"


@dataclass(frozen=True)
class EngineSignals:
    """What a replica last reported of its engine (written by that replica alone, every engine step at most
    once per ~50 ms, and by heartbeat while idle)."""

    unstarted: int = 0
    """Requests the replica received that have not produced their first token: in transit inside the replica,
    waiting in the engine, or still prefilling."""
    unstarted_tokens: int = 0
    """Their prompt tokens, each counted up to the engine's prefill chunk (what one request can take of a
    step): what the gate counts."""
    running: int = 0
    """The engine's running requests (vLLM's ``num_requests_running``)."""
    waiting: int = 0
    """The engine's waiting requests (vLLM's ``num_requests_waiting``)."""
    kv_usage: float = 0.0
    """The engine's KV-cache usage, 0 to 1."""
    received: int = 0
    """Requests the replica has received since it started (monotonic)."""


@dataclass
class ReplicaCapacity:
    """A replica's registered capacity and what of it is free (mutable model state).

    ``accepts`` are the length classes it may run at all; ``prefers`` those its pool is built for
    (placement tries preferring replicas first and spills over to the others); ``guarded`` those of its
    accepted classes it runs only while it holds none of the work it is built for (longer than it is built
    for: :func:`policies.placement.guarded_classes`).

    ``step_tokens`` is its engine's token budget per step (``max_num_batched_tokens``) and ``prefill_chunk``
    the most prompt tokens one request may take of a step (vLLM's ``long_prefill_token_threshold``; 0: the
    whole budget). ``signals`` are its engine's last report and ``fresh`` whether that report is current;
    ``in_flight`` counts grants to it that it has not acknowledged yet and ``in_flight_tokens`` their prompt
    tokens, each up to the chunk (the credit that covers the time between a grant and the report that
    includes it). ``guarded_held`` counts the grants of guarded classes it holds (granted, not yet ended).

    ``reserve`` (its pool's) is how many replicas of its placement group are kept holding no guarded work:
    one that holds none takes guarded work only while at least that many others of the group hold none too.
    """

    replica_id: str
    slots_total: int
    tokens_total: int
    accepts: frozenset[str] = field(default_factory=lambda: frozenset({"short", "long"}))
    pool: str = "default"
    prefers: frozenset[str] = field(default_factory=frozenset)
    guarded: frozenset[str] = field(default_factory=frozenset)
    step_tokens: int = 2048
    prefill_chunk: int = 0
    slots_free: int = -1
    tokens_free: int = -1
    expires_ms: int = 0
    signals: EngineSignals = field(default_factory=EngineSignals)
    signals_at_ms: int = 0
    fresh: bool = False
    in_flight: int = 0
    in_flight_tokens: int = 0
    guarded_held: int = 0
    reserve: int = 0

    @property
    def holds_own_work(self) -> bool:
        """True while it holds a grant of a class it does not guard (one its pool is built for)."""
        return self.slots_total - self.slots_free > self.guarded_held

    def step_share(self, prompt_tokens: int) -> int:
        """What a prompt weighs in this replica's pending work: its tokens, up to the prefill chunk."""
        return min(prompt_tokens, self.prefill_chunk or self.step_tokens)

    def __post_init__(self) -> None:
        if self.slots_free < 0:
            self.slots_free = self.slots_total
        if self.tokens_free < 0:
            self.tokens_free = self.tokens_total


class EnqueueResult(NamedTuple):
    """An enqueue's outcome: ``status`` is 'admitted', 'duplicate' or a rejection reason; grants made
    meanwhile; for 'rate_limited', how long until the tenant's limits would admit it, and how long until
    they would admit any request of the tenant at all (``held_ms``; 0 when a smaller one could pass now)."""

    status: str
    grants: list[Grant]
    retry_after_ms: int = 0
    held_ms: int = 0

    @property
    def admitted(self) -> bool:
        """True when the ticket entered the queue."""
        return self.status == "admitted"


class CompleteResult(NamedTuple):
    """A completion's outcome: ``done`` is False when the ticket was not granted (a repeat is a no-op)."""

    done: bool
    grants: list[Grant]


class CancelResult(NamedTuple):
    """A withdrawal's outcome: 'cancelled', 'unknown', or 'granted' (a grant won the race; it stands, and
    ``replica_id`` and ``pool`` say where)."""

    status: str
    grants: list[Grant]
    replica_id: str = ""
    pool: str = ""


class RequeueResult(NamedTuple):
    """A requeue's outcome: ``moved`` is False when the ticket was not granted."""

    moved: bool
    grants: list[Grant]
