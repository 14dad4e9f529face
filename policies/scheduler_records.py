"""The records :class:`policies.reference_scheduler.ReferenceScheduler` keeps: tickets, and per band its
tenants' waiting flows and counters (the Lua keeps the same in Redis hashes and sorted sets)."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.ordering import Fifo
from policies.types import TicketSpec


@dataclass
class TicketRecord:
    """A ticket as the queue holds it: what it asked for, where it waits, and what its grant holds."""

    spec: TicketSpec
    band: str
    entered_band_ms: int
    lease_expires_ms: int
    granted_to: str | None = None
    granted_epoch: int = 0  # the registration of granted_to that took it (only that one gets capacity back)
    granted_pool: str = ""
    reserved_tokens: int = 0
    charged_band: str = ""
    acked: bool = False  # the granted replica said it received the request
    credit: int = 0  # what the grant adds to its replica's in-flight tokens until acknowledged
    guarded: bool = False  # granted as a class its replica guards (counted in its guarded_held)
    position: int = 0  # in its flow's order (policies.ordering)
    aging_stopped: bool = False  # it reached its ceiling: it ages no further in this band
    flow: str = ""  # the flow it waits in (the one it asked for, or the overflow flow)
    topped: int = 0  # tokens charged beyond its estimate while it ran (its replica's progress reports)

    @property
    def charged(self) -> int:
        """Tokens its tenant has been charged for it so far: the estimate, and any top-ups."""
        return self.spec.cost + self.topped


@dataclass
class TenantFlows:
    """A tenant's waiting work in one band, flow by flow."""

    queues: dict[str, Fifo] = field(default_factory=dict)  # waiting flows -> their tickets
    counters: dict[str, float] = field(default_factory=dict)  # flow -> service inside the tenant
    queued: int = 0  # the tenant's waiting tickets in the band, and their tokens
    queued_tokens: int = 0


@dataclass
class BandRecord:
    """One band: its waiting tenants, their counters, and what waits in all."""

    tenants: dict[str, TenantFlows] = field(default_factory=dict)  # the active (waiting) tenants
    counters: dict[str, float] = field(default_factory=dict)
    virtual_time: float = 0.0
    queued: int = 0
    queued_tokens: int = 0
