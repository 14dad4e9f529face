"""A guard in front of Ray Serve's own HTTP handling, on the Serve proxy and on the direct-ingress ports.

Ray Serve reads some request headers itself, before any code of the gateway runs: it decodes
``x-request-id``, ``x-session-id`` and ``serve_multiplexed_model_id`` as UTF-8 (a Latin-1 byte there was a
plain-text 500), writes ``x-request-id`` whole into its access logs and echoes it back, and takes headers of
any size and forwards them to the gateway replica. This middleware runs first:

- headers over :data:`MAX_HEADER_BYTES` in all (names and values; ``FLEETGATE_MAX_HEADER_BYTES``, 0: no
  limit) are a 431 in OpenAI's error format, before they travel on to a replica;
- an ``x-request-id`` that is not 1-128 visible ASCII characters is dropped, so Ray makes a fresh one (and
  echoes that);
- a session or multiplexed-model header that is not UTF-8 is dropped.

Ray installs it from ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` (:data:`GUARD_ENV`), read where each
Ray node starts: ``scripts/serve-local.sh`` and the KubeRay manifest set it. The server below has already
read the headers into memory; a cap in front (docs/operations.md) bounds that.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.middleware import Middleware

from gateway.errors import error_body  # fastapi, which it imports, is loaded in Ray's proxy already

GUARD_ENV = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "gateway.http_guard.middlewares"}
MAX_HEADER_BYTES = 64 * 1024  # Envoy's default for all headers of a request; nginx allows 4 x 8 KB lines
MAX_REQUEST_ID_CHARS = 128

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]

_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,%d}" % MAX_REQUEST_ID_CHARS)
_SESSION_ID = os.environ.get("RAY_SERVE_SESSION_ID_HEADER_KEY", "x-session-id").lower().encode()


def guard_installed(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the Ray node this process runs on was started with the guard: Ray's workers inherit the
    environment its node started with, as its proxy does."""
    (name, path), = GUARD_ENV.items()
    return environ.get(name) == path


def missing_guard_advice() -> str:
    """What an operator does about a node started without the guard."""
    (name, path), = GUARD_ENV.items()
    return (f"Ray on this node was started without fleetgate's header guard, so headers of any size reach the "
            f"gateway and a request id Ray cannot decode is a plain-text 500: start Ray with {name}={path} "
            "(scripts/serve-local.sh and the KubeRay manifest do)")


def middlewares() -> list[Middleware]:
    """What Ray Serve's HTTP servers wrap their app in (the import path of :data:`GUARD_ENV`)."""
    limit = int(os.environ.get("FLEETGATE_MAX_HEADER_BYTES", MAX_HEADER_BYTES))
    return [Middleware(HeaderGuard, max_header_bytes=limit)]


class HeaderGuard:
    """ASGI middleware: refuse oversized headers (431), drop request-context headers Ray cannot read."""

    def __init__(self, app: ASGIApp, max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            headers = scope.get("headers") or []
            size = sum(len(name) + len(value) for name, value in headers)
            if self.max_header_bytes and size > self.max_header_bytes:
                await _refuse_headers(send, size, self.max_header_bytes)
                return
            kept = [(name, value) for name, value in headers if _readable(name, value)]
            if len(kept) != len(headers):
                scope = {**scope, "headers": kept}
        await self.app(scope, receive, send)


def _readable(name: bytes, value: bytes) -> bool:
    """False for a header Ray Serve would fail on, log whole, or echo back as sent."""
    name = name.lower()
    if name == b"x-request-id":
        return _REQUEST_ID.fullmatch(value) is not None
    if name == _SESSION_ID or name.replace(b"-", b"_") == b"serve_multiplexed_model_id":
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return True


async def _refuse_headers(send: Callable, size: int, limit: int) -> None:
    body = json.dumps(error_body(f"The request's headers are {size} bytes; this gateway takes at most {limit}.",
                                 "invalid_request_error", "request_header_fields_too_large")).encode()
    await send({"type": "http.response.start", "status": 431, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]})
    await send({"type": "http.response.body", "body": body})
