"""The gateway's handles to its replica pools: forwarding a request, and the model listing."""

from __future__ import annotations

from typing import Any

from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from gateway.errors import UpstreamUnavailable
from gateway.request_parsing import ParsedRequest
from gateway.routing import GRANT_KWARG


class Pools:
    """One Serve deployment handle per pool; the first pool is the default."""

    def __init__(self, handles: dict[str, DeploymentHandle]) -> None:
        if not handles:
            raise ValueError("the gateway needs at least one replica pool")
        self._handles = handles
        # a streaming handle per pool, made once: `options()` builds a new handle object each time it is called
        self._streams = {pool: handle.options(stream=True) for pool, handle in handles.items()}
        self._default = next(iter(handles))
        self._listing: dict[str, Any] | None = None

    def call(self, pool: str, replica_id: str | None, parsed: ParsedRequest, ticket_id: str | None = None,
             prompt_tokens: int = 0, charged: int = 0) -> DeploymentResponseGenerator:
        """Start the request on ``pool`` (on ``replica_id`` when a grant names one; ``ticket_id`` is the grant
        the replica acknowledges, ``prompt_tokens`` the prompt's count, ``charged`` what the grant charged).

        A pool this gateway does not know (config drift) reaches the default pool, which answers misrouted.
        """
        handle = self._streams.get(pool) or self._streams[self._default]
        grant = {GRANT_KWARG: replica_id, "ticket_id": ticket_id, "charged": charged} if replica_id is not None else {}
        return handle.generate.remote(parsed.endpoint, parsed.body, prompt_tokens=prompt_tokens, **grant)

    async def served(self, pool: str, replica_id: str, ticket_id: str, timeout_s: float) -> int | None:
        """Tokens ``replica_id``'s engine served for grant ``ticket_id`` once its call ended (the client left
        before the reply); None if the replica does not know within ``timeout_s``."""
        handle = self._handles.get(pool) or self._handles[self._default]
        return await handle.served.remote(ticket_id, timeout_s, **{GRANT_KWARG: replica_id})

    async def listing(self) -> dict[str, Any]:
        """vLLM's model listing (fetched from a replica once, then cached)."""
        if self._listing is None:
            try:
                self._listing = await self._handles[self._default].models.remote()
            except Exception as exc:
                raise UpstreamUnavailable(f"No replica answered the model listing: {type(exc).__name__}")
        return self._listing

    async def max_model_len(self) -> int:
        """The served context length (0 when the listing does not say)."""
        return int((await self.listing())["data"][0].get("max_model_len") or 0)
