"""How a forwarded request ends: what it served, its latency metrics, and (through the queue) its ledger.

:class:`RequestOutcome` is the end of every request: it watches a streamed reply (tokens served, when
each chunk came), records the latency metrics and charges the served tokens once. With the global queue,
:class:`gateway.admission.TicketAccounting` extends it: the grant's capacity goes back, the tenant's VTC
counter and rate bucket are corrected to what was served, and a misrouted call is requeued.
"""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.errors import UpstreamUnavailable
from gateway.metrics import GatewayMetrics


class StreamUsage:
    """Watches a reply's SSE lines; knows the tokens served; hides the usage chunk the client did not ask for.

    The gateway always asks vLLM for a final usage chunk (it charges tenants by it); a client that did not
    request ``stream_options.include_usage`` does not see that chunk. ``chunk_times`` are the monotonic
    times of the chunks that carried output (the chat stream's opening role-only chunk is not one).
    """

    def __init__(self, prompt_tokens: int, client_wants_usage: bool) -> None:
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
            self.chunk_times.append(time.monotonic())
        return True

    @property
    def total_tokens(self) -> int:
        """Prompt + output tokens served: vLLM's figure when the stream finished, else prompt + chunks."""
        if self._reported_total is not None:
            return self._reported_total
        return self._prompt_tokens + self._chunks


class RequestOutcome:
    """The end of one forwarded request, without the global queue (see TicketAccounting for the queue)."""

    def __init__(self, metrics: GatewayMetrics, tenant: str, band: str, arrived: float,
                 headers: dict[str, str], prompt_tokens: int = 0, client_wants_usage: bool = True) -> None:
        self.metrics, self.tenant, self.band, self.arrived = metrics, tenant, band, arrived
        self._headers = headers
        self._prompt_tokens, self._client_wants_usage = prompt_tokens, client_wants_usage
        self._usage: StreamUsage | None = None
        self._finished = False

    def response_headers(self) -> dict[str, str]:
        """Headers that tell the client how its request was classified (and queued)."""
        return dict(self._headers)

    def misrouted(self, header: dict[str, Any]) -> bool:
        """True when the call reached a replica other than the granted one (only with the queue)."""
        return False

    async def retry(self) -> Any:
        """Forward again after a misrouted call (only with the queue)."""
        await self.failed()
        raise UpstreamUnavailable("The request reached the wrong replica.")

    def stream_usage(self) -> StreamUsage:
        """The watcher of this request's stream (it also decides whether the usage chunk is shown)."""
        self._usage = StreamUsage(self._prompt_tokens, self._client_wants_usage)
        return self._usage

    async def stream_ended(self) -> None:
        """The stream ended (completed, failed or the client left): record its latencies, charge it."""
        if self._usage is not None:
            self.metrics.observe_stream(self.band, self.arrived, self._usage.chunk_times)
        await self.finish(self._usage.total_tokens if self._usage else 0)

    async def finished(self, total_tokens: int | None) -> None:
        """A non-streamed reply completed with vLLM's usage figure."""
        await self.finish(total_tokens if total_tokens is not None else self._prompt_tokens)

    async def failed(self) -> None:
        """The replica answered with an error or failed before serving anything."""
        await self.finish(0)

    async def finish(self, served_tokens: int) -> None:
        """Record the end once: duration and tokens served."""
        if self._finished:
            return
        self._finished = True
        self.metrics.duration.labels(self.band).observe(time.monotonic() - self.arrived)
        if served_tokens:
            self.metrics.tokens.labels(self.metrics.tenant(self.tenant), self.band).inc(served_tokens)
        await self.settle(served_tokens)

    async def settle(self, served_tokens: int) -> None:
        """Return what the request held (nothing without the queue)."""
