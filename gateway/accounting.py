"""What a streamed reply served: the usage vLLM reports, or the chunks relayed when the stream was cut."""

from __future__ import annotations

import json


class StreamUsage:
    """Watches a reply's SSE lines; knows the tokens served; hides the usage chunk the client did not ask for.

    The gateway always asks vLLM for a final usage chunk (it charges tenants by it); a client that did not
    request ``stream_options.include_usage`` does not see that chunk.
    """

    def __init__(self, prompt_tokens: int, client_wants_usage: bool) -> None:
        self._prompt_tokens = prompt_tokens
        self._client_wants_usage = client_wants_usage
        self._chunks = 0
        self._reported_total: int | None = None

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
        return True

    @property
    def total_tokens(self) -> int:
        """Prompt + output tokens served: vLLM's figure when the stream finished, else prompt + chunks."""
        if self._reported_total is not None:
            return self._reported_total
        return self._prompt_tokens + self._chunks
