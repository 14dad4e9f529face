"""What a streamed reply had served when it was cut: the engine's own count in the latest line it sent.

The gateway asks vLLM for usage in every chunk (``continuous_usage_stats``) and charges a stream by the
latest count it relayed. A replica that joins a stream's lines (replicas/stream_batching.py) holds up to one
interval of them, so when the client leaves, the lines it held never reach the gateway: the replica keeps
the latest count it read from the engine, and answers the gateway's question with it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any


class LatestUsage:
    """Passes a reply's items on unchanged, remembering the last SSE line that carried usage (parsed only
    when asked, so a stream costs one substring check a line)."""

    def __init__(self, items: AsyncIterator[Any]) -> None:
        self._items = items
        self._line: str | None = None

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for item in self._items:
            if isinstance(item, str) and '"usage"' in item:
                self._line = item
            yield item

    def total_tokens(self) -> int | None:
        """Prompt + output tokens in the latest usage the engine sent; None before any."""
        for event in reversed((self._line or "").split("\n\n")):
            if not event.startswith("data: {"):
                continue
            usage = json.loads(event[len("data: "):]).get("usage")
            if usage and usage.get("total_tokens") is not None:
                return int(usage["total_tokens"])
        return None
