"""The global queue's declarative config (the ``queue`` block of the app config), shared by the gateway
and the replicas: bands, length classes, leases and the Redis connection."""

from __future__ import annotations

import logging
import os

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.classification import LengthClasses

logger = logging.getLogger(__name__)
_OVERRIDE_LOGGED: list[bool] = []  # once per process


class BandConfig(BaseModel):
    """One priority band of the global queue (bands are listed highest first)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="Band name, as clients name it.")
    aging_s: float = Field(0, ge=0, description="Starvation guard: waiting this long promotes a ticket one band.")
    max_queued: int = Field(10_000, ge=1, description="Most tickets waiting in this band (then 429).")
    max_queued_tokens: int = Field(50_000_000, ge=1, description="Most estimated tokens waiting (then 429).")
    tenant_share: float = Field(
        0.5, gt=0, le=1, description="The most of max_queued and max_queued_tokens one tenant may hold waiting "
        "(then 429 tenant_queue_full): one tenant's flood cannot fill the band and lock the others out.",
    )
    max_unstarted_steps: float | None = Field(
        None, gt=0, description="Gate: a replica whose engine reports current signals takes this band's tickets "
        "only while the prompt tokens it has not started (requests waiting, in transit or still prefilling, plus "
        "grants on their way) are below this many of its engine steps' token budgets (max_num_batched_tokens). "
        "More lets the engine's own queue grow, where bands and fairness do not reach; fewer than ~1.5 leaves "
        "part of a step idle (vLLM caps one prompt's share of a step at long_prefill_token_threshold). "
        "None: 3 for the first band, 2 below it.",
    )
    kv_ceiling: float | None = Field(
        None, gt=0, le=1, description="Gate: ... and while its KV-cache usage is below this. Lower bands stop "
        "earlier, so the KV cache keeps room for the top band's requests. None: 0.95 for the first band, 0.85 "
        "below it.",
    )


class LengthClassConfig(BaseModel):
    """One prompt-length class; classes are listed shortest first and the last has no bound."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="Class name (header, metrics, placement).")
    max_prompt_tokens: int | None = Field(None, ge=1, description="Longest prompt in this class (None: unbounded).")


def _default_length_classes() -> list[LengthClassConfig]:
    return [LengthClassConfig(name="short", max_prompt_tokens=512), LengthClassConfig(name="long")]


def _default_bands() -> list[BandConfig]:
    return [
        BandConfig(name="interactive", max_unstarted_steps=3, kv_ceiling=0.95),
        BandConfig(name="standard", aging_s=30, max_unstarted_steps=2, kv_ceiling=0.85),
        BandConfig(name="batch", aging_s=60, max_unstarted_steps=1.5, kv_ceiling=0.8),
    ]


# a band's gate when the config leaves it out: the first band, and every band below it
TOP_BAND_GATE = (3.0, 0.95)
LOWER_BAND_GATE = (2.0, 0.85)


class QueueConfig(BaseModel):
    """The Redis-backed global queue: fleet-wide priority bands and token-weighted fairness."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Off: forward straight to replicas (Serve's default router).")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis URL (redis://, rediss:// for TLS, user:password@ for AUTH); REDIS_URL overrides.",
    )
    redis_cluster: bool = Field(
        False, description="The URL names a node of a Redis Cluster: use redis-py's cluster client. A namespace's "
        "keys share one hash slot, so each namespace lives on one shard; give models or pools their own namespace "
        "to spread them.",
    )
    redis_max_connections: int = Field(
        64, ge=2, description="Connections one process opens to Redis at most. A call that finds them all busy "
        "waits for one (up to redis_pool_timeout_s) instead of failing, so a burst queues instead of answering 503.",
    )
    redis_pool_timeout_s: float = Field(
        10, gt=0, description="Longest a call waits for a free Redis connection before the request gets a 503.",
    )
    redis_socket_timeout_s: float = Field(
        30, gt=0, description="Longest one Redis command may take before its request gets a 503. Generous: under "
        "a burst a loaded gateway's event loop can be slow to read a reply (redis-py's own default, 5 s, turned a "
        "1,000-request burst into a few 503s here).",
    )
    redis_functions: bool = Field(
        True, description="Run the queue's Lua as a Redis 7 function library (defined once, not on every call: "
        "about 18 µs less Redis time per call here). Off, or on a server without functions (Redis 6) or an account "
        "that may not load them: scripts (EVALSHA).",
    )
    namespace: str = Field("default", description="Queue namespace: one per independent fleet or model.")
    bands: list[BandConfig] = Field(default_factory=_default_bands, description="Bands, highest first.")
    default_band: str = Field("standard", description="Band of a request that names none.")
    lease_s: float = Field(10, gt=0, description="Ticket and replica lease; renewed every third of it.")
    unreachable_hold_s: float = Field(
        10, ge=0, description="How long a replica that a gateway's router delivered to before, and can no longer "
        "reach (Serve is draining it), stays out of the fleet: its heartbeat would otherwise bring it back while "
        "it drains, and each grant to it costs a request a requeue. Long enough to outlast a heartbeat or two, "
        "short enough that a replica wrongly held is used again soon. The gateway renews it every half hold while "
        "none of its routers lists the replica (at most the pools' longest drain). A replica the router never "
        "reached (new, not yet published to it) is not held.",
    )
    max_wait_s: float = Field(120, gt=0, description="Longest a request waits for a grant (then 429).")
    retry_after_s: int = Field(2, ge=1, description="Retry-After sent with a queue-full or timeout 429.")
    length_classes: list[LengthClassConfig] = Field(
        default_factory=_default_length_classes,
        description="Prompt-length classes, shortest first, the last unbounded (placement and metrics use them).",
    )
    default_output_tokens: int = Field(256, ge=1, description="Output estimate when max_tokens is unset.")
    max_flows_per_tenant: int = Field(
        64, ge=1, description="Waiting flows (x-gateway-inference-fairness-id) one tenant may have in a band; a "
        "request of one more joins a shared overflow flow, so no client's stream of fresh ids grows Redis.",
    )
    signal_interval_s: float = Field(
        0.05, gt=0, description="A replica reports its engine's signals at most this often (it reports on engine "
        "steps: every step would be hundreds of writes a second per replica).",
    )
    signal_heartbeat_s: float = Field(
        0.5, gt=0, description="An idle engine reports nothing; its replica repeats its last report this often.",
    )
    signal_stale_s: float = Field(
        2.0, gt=0, description="Signals older than this are stale: the gate falls back to the replica's "
        "concurrency cap (its max_num_seqs), so late reports never halt dispatch. Several heartbeats long.",
    )
    progress_interval_s: float = Field(
        1.0, gt=0, description="A replica tells the queue, at most this often, what its running requests have "
        "served past their estimate (a request without max_tokens is estimated at default_output_tokens), so "
        "their tenants are charged as they run, not only when they end: a tenant whose requests run long "
        "cannot keep winning grants meanwhile. Shorter: fairer while they run, more Redis writes.",
    )
    objectives: dict[str, str] = Field(
        default_factory=dict,
        description="x-gateway-inference-objective name -> band (alias for users of the Inference Extension).",
    )

    @model_validator(mode="after")
    def _bands_consistent(self) -> "QueueConfig":
        names = [band.name for band in self.bands]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"band names must be unique and non-empty, got {names}")
        if self.default_band not in names:
            raise ValueError(f"default_band {self.default_band!r} is not one of {names}")
        for objective, band in self.objectives.items():
            if band not in names:
                raise ValueError(f"objective {objective!r} maps to unknown band {band!r}; bands are {names}")
        self.length_class_policy()  # raises on bad bounds
        self._resolve_gates()
        if self.signal_stale_s <= 2 * max(self.signal_heartbeat_s, self.signal_interval_s):
            raise ValueError("signal_stale_s must be more than twice signal_heartbeat_s and signal_interval_s, or "
                             "an idle replica's signals go stale between its heartbeats")
        return self

    def _resolve_gates(self) -> None:
        """Fill each band's gate left unset, and refuse a lower band more headroom than a band above it: the
        gate then closes bands from the bottom up, and strict band order holds at every replica."""
        for index, band in enumerate(self.bands):
            default = TOP_BAND_GATE if index == 0 else LOWER_BAND_GATE
            above = self.bands[index - 1] if index else None
            if band.max_unstarted_steps is None:
                band.max_unstarted_steps = min(default[0], above.max_unstarted_steps) if above else default[0]
            if band.kv_ceiling is None:
                band.kv_ceiling = min(default[1], above.kv_ceiling) if above else default[1]
            if above and (band.max_unstarted_steps > above.max_unstarted_steps or band.kv_ceiling > above.kv_ceiling):
                raise ValueError(f"band {band.name!r} has a larger gate (max_unstarted_steps, kv_ceiling) than "
                                 f"{above.name!r} above it: lower bands must close first")

    @property
    def band_names(self) -> list[str]:
        """Band names, highest first."""
        return [band.name for band in self.bands]

    def vllm_priority(self, band: str) -> int:
        """The band's vLLM priority: its position, 0 for the highest (vLLM runs lower values first)."""
        return self.band_names.index(band)

    def length_class_policy(self) -> LengthClasses:
        """The length classes as the classification policy uses them."""
        return LengthClasses.from_bounds([(c.name, c.max_prompt_tokens) for c in self.length_classes])

    def resolved_redis_url(self) -> str:
        """REDIS_URL from the environment when set, else the configured URL (an override is logged once per
        process, without the URL: it may hold a password)."""
        override = os.environ.get("REDIS_URL")
        if override and override != self.redis_url and not _OVERRIDE_LOGGED:
            _OVERRIDE_LOGGED.append(True)
            logger.warning("REDIS_URL from the environment overrides queue.redis_url of the config")
        return override or self.redis_url
