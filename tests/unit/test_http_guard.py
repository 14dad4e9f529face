"""The header guard in front of Ray Serve's HTTP handling (gateway/http_guard.py), as ASGI middleware."""

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from gateway.http_guard import GUARD_ENV, HeaderGuard, guard_installed, middlewares, missing_guard_advice

REPO = Path(__file__).resolve().parents[2]


def run(headers: list[tuple[bytes, bytes]], limit: int = 1024) -> tuple[list[dict], list | None]:
    """The messages the guard sends, and the headers the app behind it saw (None: not called)."""
    seen: list = []
    sent: list[dict] = []

    async def app(scope, receive, send):
        seen.append(scope["headers"])

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    asyncio.run(HeaderGuard(app, max_header_bytes=limit)(scope, receive, send))
    return sent, (seen[0] if seen else None)


def test_headers_over_the_limit_are_431_in_openai_format_and_never_reach_the_app() -> None:
    sent, seen = run([(b"x-junk", b"a" * 2000)])
    assert seen is None
    assert sent[0]["status"] == 431
    error = json.loads(sent[1]["body"])["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "request_header_fields_too_large")
    assert "2006 bytes" in error["message"]


def test_headers_under_the_limit_pass_unchanged() -> None:
    headers = [(b"authorization", b"Bearer k"), (b"x-request-id", b"abc-123"), (b"x-priority", b"batch")]
    sent, seen = run(headers)
    assert (sent, seen) == ([], headers)


@pytest.mark.parametrize("value", [b"r\xe9q", b"a" * 129, b"has space", "ключ".encode(), b""])
def test_a_request_id_ray_cannot_read_or_would_log_whole_is_dropped(value: bytes) -> None:
    _, seen = run([(b"x-request-id", value), (b"x-priority", b"batch")])
    assert seen == [(b"x-priority", b"batch")]  # Ray then makes a fresh id


@pytest.mark.parametrize("name", [b"x-session-id", b"serve_multiplexed_model_id", b"Serve-Multiplexed-Model-Id"])
def test_request_context_headers_that_are_not_utf8_are_dropped(name: bytes) -> None:
    assert run([(name, b"\xff")])[1] == []
    assert run([(name, "é".encode())])[1] == [(name, "é".encode())]


def test_websockets_and_lifespan_pass_through() -> None:
    called = []

    async def app(scope, receive, send):
        called.append(scope["type"])

    guard = HeaderGuard(app, max_header_bytes=1)
    asyncio.run(guard({"type": "lifespan"}, None, None))
    assert called == ["lifespan"]


def test_the_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETGATE_MAX_HEADER_BYTES", "4096")
    (middleware,) = middlewares()
    assert middleware.cls is HeaderGuard and middleware.kwargs == {"max_header_bytes": 4096}


def test_every_launcher_installs_the_guard() -> None:
    (name, path), = GUARD_ENV.items()
    assert f'{name}="${{{name}:-{path}}}"' in (REPO / "scripts" / "serve-local.sh").read_text()
    documents = list(yaml.safe_load_all((REPO / "deploy" / "kuberay" / "rayservice.yaml").read_text()))
    text = json.dumps(documents)
    assert text.count(json.dumps({"name": name, "value": path})) == 2  # head and workers


def test_a_node_started_without_the_guard_is_told_apart() -> None:
    (name, path), = GUARD_ENV.items()
    assert guard_installed({name: path})
    assert not guard_installed({}) and not guard_installed({name: "somebody.else:middlewares"})
    assert f"{name}={path}" in missing_guard_advice()
