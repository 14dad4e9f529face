"""How a forwarded request ends: what it served (:class:`StreamUsage` watches a stream), its latency
metrics, and its place given back with the tenant charged once (:class:`Settlement`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from gateway.admission import Admitted
from gateway.metrics import GatewayMetrics


class StreamUsage:
    """Watches a reply's SSE lines; knows the tokens served; hides the usage chunk the client did not ask for.

    The gateway always asks vLLM for a final usage chunk (it charges tenants by it); a client that did not
    request ``stream_options.include_usage`` does not see that chunk. ``chunk_times`` are the monotonic
    times of the chunks that carried output (the chat stream's opening role-only chunk is not one).
    """

    def __init__(self, prompt_tokens: int, client_wants_usage: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._prompt_tokens = prompt_tokens
        self._client_wants_usage = client_wants_usage
        self._chunks = 0
        self._reported_total: int | None = None
        self.chunk_times: list[float] = []

    def observe(self, line: str) -> bool:
        """Record one SSE line; True when it should go on to the client."""
        if not line.startswith("data: {"):
            return True
        if '"usage"' in line:
            event = json.loads(line[len("data: "):])
            usage = event.get("usage")
            if usage:
                self._reported_total = int(usage.get("total_tokens") or 0)
                if not event.get("choices"):
                    return self._client_wants_usage
        self._chunks += 1
        if '"role":' not in line:
            self.chunk_times.append(self._clock())
        return True

    @property
    def total_tokens(self) -> int:
        """Prompt + output tokens served: vLLM's figure when the stream finished, else prompt + chunks."""
        if self._reported_total is not None:
            return self._reported_total
        return self._prompt_tokens + self._chunks


class Settlement:
    """How one admitted request ends, exactly once: its latency metrics, then its place's release (capacity
    back, the tenant charged ``served_tokens``). Every exit path of a request calls :meth:`settle`; only the
    first call counts."""

    def __init__(self, metrics: GatewayMetrics, tenant: str, band: str, arrived: float, place: Admitted,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics, self._tenant, self._band, self._arrived = metrics, tenant, band, arrived
        self._place, self._clock = place, clock
        self._settled = False

    async def settle(self, served_tokens: int, chunk_times: list[float] | None = None) -> None:
        """Record the end (duration, stream latencies, tokens served) and release the place, once."""
        if self._settled:
            return
        self._settled = True
        self._metrics.duration.labels(self._band).observe(self._clock() - self._arrived)
        if chunk_times:
            self._metrics.observe_stream(self._band, self._arrived, chunk_times)
        if served_tokens:
            self._metrics.tokens.labels(self._metrics.tenant(self._tenant), self._band).inc(served_tokens)
        await self._place.release(served_tokens)


def reported_tokens(body: dict[str, Any], prompt_tokens: int) -> int:
    """Tokens a non-streamed reply served: vLLM's usage figure, else the prompt."""
    total = (body.get("usage") or {}).get("total_tokens")
    return int(total) if total is not None else prompt_tokens
