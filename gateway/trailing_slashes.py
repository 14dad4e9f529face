"""A path with a trailing slash is served as the path without it (``/v1/chat/completions/``).

Starlette would answer it with a 307 to a URL built from the request's Host header: plain http behind a
TLS-terminating proxy, to which a client that follows redirects sends the body (the prompt) again.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class TrailingSlashes:
    """ASGI middleware: drops the trailing slashes of an HTTP request's path (never the root's)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            trimmed = path.rstrip("/") or "/"
            scope = {**scope, "path": trimmed, "raw_path": trimmed.encode()}
        await self.app(scope, receive, send)
