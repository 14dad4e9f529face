"""How a forwarded request ends: what it served (:class:`StreamUsage` watches a stream), its latency
metrics, and its place given back with the tenant charged once (:class:`Settlement`)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.admission import Admitted
from gateway.metrics import GatewayMetrics

RUNNING_APART: set[asyncio.Task[None]] = set()  # settlements still going after their request was cancelled


async def run_apart(work: Coroutine[Any, Any, None], context: contextvars.Context | None = None) -> None:
    """Run ``work`` (a request's settlement) in a task of its own and wait for it: a further cancel of the
    caller ends the wait, not the work, which is kept referenced until it ends. ``context``: the task's
    context variables (default: the caller's)."""
    task = asyncio.get_running_loop().create_task(work, context=context)
    RUNNING_APART.add(task)
    task.add_done_callback(RUNNING_APART.discard)
    await asyncio.shield(task)


class StreamUsage:
    """Watches a reply's SSE lines; knows the tokens served; hides the usage the client did not ask for.

    The gateway always asks vLLM for usage in every chunk (``continuous_usage_stats``) and in a final chunk:
    tenants are charged by the engine's own count, so a stream cut anywhere is charged the tokens the engine
    had produced by then, however many a chunk carried. A client that did not ask for them does not see
    them (``include_usage`` for the final chunk, ``continuous_usage_stats`` for the rest). ``chunk_times``
    are the monotonic times of the chunks that carried output (the chat stream's role-only chunk is not one).
    """

    def __init__(self, prompt_tokens: int, client_wants_usage: bool, clock: Callable[[], float] = time.monotonic,
                 client_wants_continuous: bool = False) -> None:
        self._clock = clock
        self._prompt_tokens = prompt_tokens
        self._client_wants_usage = client_wants_usage
        self._client_wants_continuous = client_wants_continuous
        self._chunks = 0
        self._reported_total: int | None = None
        self.chunk_times: list[float] = []
        self.finished = False  # the stream ended ([DONE], or its replica failed): nothing left to ask it

    def observe(self, line: str) -> str | None:
        """Record one SSE line; the line to send on to the client (usage taken out if it did not ask for
        it), or None to hold it back."""
        if not line.startswith("data: {"):
            self.finished = self.finished or line.startswith("data: [DONE]")
            return line
        if '"usage"' in line:
            event = json.loads(line[len("data: "):])
            usage = event.get("usage")
            if usage:
                self._reported_total = int(usage.get("total_tokens") or 0)
                if not event.get("choices"):
                    return line if self._client_wants_usage else None
                if not self._client_wants_continuous:
                    del event["usage"]
                    line = f"data: {json.dumps(event, separators=(',', ':'))}\n\n"
        self._chunks += 1
        if '"role":' not in line:
            self.chunk_times.append(self._clock())
        return line

    @property
    def total_tokens(self) -> int:
        """Prompt + output tokens served: vLLM's latest figure, else (it sent none) prompt + chunks."""
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
