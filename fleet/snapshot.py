"""The global queue's state as one typed, consistent read (what ``snapshot.lua`` returns).

Lua's cjson encodes an empty table as ``{}`` whether it stands for a list or a map; the models here turn it
into the right empty value, once, so no reader has to know.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _as_map(value: Any) -> Any:
    return value if isinstance(value, dict) else {}


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) else []


def _classes(value: Any) -> Any:
    return [c for c in (value or "").split(",") if c] if isinstance(value, str) else _as_list(value)




class TenantWaiting(BaseModel):
    """What one tenant has waiting in a band."""

    queued: int
    queued_tokens: int


class BandState(BaseModel):
    """One band: its tenants' virtual token counters, who is waiting, and how much."""

    model_config = ConfigDict(extra="ignore")

    name: str
    counters: Annotated[dict[str, float], BeforeValidator(_as_map)] = Field(default_factory=dict)
    active: Annotated[list[str], BeforeValidator(_as_list)] = Field(default_factory=list)
    tenants: Annotated[dict[str, TenantWaiting], BeforeValidator(_as_map)] = Field(default_factory=dict)
    queued: int = 0
    queued_tokens: int = 0
    max_unstarted_steps: float = 0.0
    kv_ceiling: float = 0.0


class ReplicaState(BaseModel):
    """One registered replica's capacity, what of it is free, when its lease ends, and its engine's signals
    with what the gate makes of them (``pending`` work, ``open_bands``)."""

    model_config = ConfigDict(extra="ignore")

    replica_id: str
    expires_ms: int = 0
    slots_total: int
    slots_free: int
    tokens_total: int
    tokens_free: int
    pool: str = ""
    accepts: Annotated[list[str], BeforeValidator(_classes)] = Field(default_factory=list)
    prefers: Annotated[list[str], BeforeValidator(_classes)] = Field(default_factory=list)
    fresh: bool = False
    pending: int = 0
    in_flight: int = 0
    in_flight_tokens: int = 0
    unstarted: int = 0
    unstarted_tokens: int = 0
    step_tokens: int = 0
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    received: int = 0
    signals_at_ms: int = 0
    guarded_held: int = 0
    """Grants of classes it takes only when it holds none of its own work (long prompts on a latency replica)."""
    reserve: int = 0
    """Its pool's reserve: replicas of its group kept free of such grants."""
    open_bands: Annotated[list[str], BeforeValidator(_as_list)] = Field(default_factory=list)

    @property
    def idle(self) -> bool:
        """True when nothing granted holds any of its capacity."""
        return self.slots_free == self.slots_total and self.tokens_free == self.tokens_total


class QueueSnapshot(BaseModel):
    """Bands, replicas, event totals and tokens served per tenant, read in one atomic step."""

    model_config = ConfigDict(extra="ignore")

    now_ms: int = 0  # the queue's clock (policies/clock.py), which leases and ages are measured against
    wall_ms: int = 0  # the Redis server's wall clock at the same moment
    bands: Annotated[list[BandState], BeforeValidator(_as_list)]
    replicas: Annotated[list[ReplicaState], BeforeValidator(_as_list)] = Field(default_factory=list)
    stats: Annotated[dict[str, int], BeforeValidator(_as_map)] = Field(default_factory=dict)
    served: Annotated[dict[str, int], BeforeValidator(_as_map)] = Field(default_factory=dict)
    tickets: int = 0

    @property
    def clock_behind_s(self) -> float:
        """How far the queue's clock runs behind the wall clock: what it cut from wall-clock jumps."""
        return max(0, self.wall_ms - self.now_ms) / 1000 if self.wall_ms else 0.0

    def band(self, name: str) -> BandState:
        """The band called ``name``."""
        return next(band for band in self.bands if band.name == name)
