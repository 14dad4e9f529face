"""``x-request-id``: honoured when the client sends a usable one, generated otherwise, echoed on every response.

A plain ASGI middleware (not Starlette's BaseHTTPMiddleware, which buffers and breaks streamed replies):
the id is put in ``request.state.request_id`` and added to the response's first message, errors included.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

REQUEST_ID = "x-request-id"
_USABLE = re.compile(r"^[A-Za-z0-9_.:/=+-]{1,128}$")


def request_id_from(raw: str | None) -> str:
    """The client's id when it is 1-128 safe characters; else a fresh one (never echoes odd input back)."""
    if raw is not None and _USABLE.match(raw):
        return raw
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Gives every HTTP request an id and echoes it in the response headers."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == REQUEST_ID.encode()), None)
        request_id = request_id_from(raw)
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID.encode()]
                headers.append((REQUEST_ID.encode(), request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)
