"""Per-tenant rate limits (requests and tokens per minute) as token buckets in Redis.

Each check is one atomic Lua step on the tenant's bucket, so the limits hold across every gateway replica.
Tokens are taken at admission by the request's estimate (prompt + max output) and settled when it ends by
what it actually served, so a tenant pays for what it used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import redis.asyncio as aioredis

from fleet.keys import QueueKeys


class RateLimits(Protocol):
    """A tenant's limits (None: unlimited), as the tenants file states them."""

    requests_per_minute: int | None
    tokens_per_minute: int | None

_SCRIPT = (Path(__file__).with_name("lua") / "rate_limit.lua").read_text()


@dataclass(frozen=True)
class RateDecision:
    """Whether a request may go on; when not, how long until it could."""

    admitted: bool
    retry_after_s: float = 0.0


class RateLimiter:
    """Token buckets of every tenant of one namespace."""

    def __init__(self, client: aioredis.Redis, keys: QueueKeys) -> None:
        self._keys = keys
        self._script = client.register_script(_SCRIPT)

    async def take(self, tenant: str, limits: RateLimits, tokens: int, now_ms: int | None = None) -> RateDecision:
        """Admit one request of ``tokens`` estimated tokens, or say how long to wait (nothing is taken then)."""
        if limits.requests_per_minute is None and limits.tokens_per_minute is None:
            return RateDecision(True)
        admitted, retry_ms = await self._call("take", tenant, limits, tokens, now_ms)
        return RateDecision(bool(admitted), int(retry_ms) / 1000)

    async def settle(self, tenant: str, limits: RateLimits, extra_tokens: int, now_ms: int | None = None) -> None:
        """Charge ``extra_tokens`` served beyond the estimate (negative: give the unused estimate back)."""
        if limits.tokens_per_minute is not None and extra_tokens:
            await self._call("settle", tenant, limits, extra_tokens, now_ms)

    async def _call(self, op: str, tenant: str, limits: RateLimits, tokens: int, now_ms: int | None) -> list[int]:
        args = [op, _text(limits.requests_per_minute), _text(limits.tokens_per_minute), _text(now_ms), str(int(tokens))]
        return await self._script(keys=[self._keys.rate_bucket(tenant)], args=args)


def _text(value: int | None) -> str:
    return "" if value is None else str(int(value))
