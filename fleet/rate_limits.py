"""Per-tenant rate limits as the queue takes them: requests and tokens per minute (None: unlimited).

The buckets live in Redis and are taken, settled and refunded inside the queue's own Lua steps
(``fleet/lua/rate_limits.lua``), so they hold across every gateway replica at no extra round trip.
"""

from __future__ import annotations

from typing import Protocol


class RateLimits(Protocol):
    """A tenant's limits, as the tenants file states them."""

    requests_per_minute: int | None
    tokens_per_minute: int | None
