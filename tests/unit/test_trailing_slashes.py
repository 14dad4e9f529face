"""A trailing slash is served, not redirected (a 307 to a URL from the Host header: http behind TLS)."""

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.trailing_slashes import TrailingSlashes


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.url.path, "body": (await request.body()).decode()})


@pytest.fixture
def app() -> TrailingSlashes:
    routes = [Route("/v1/chat/completions", _echo, methods=["POST"]), Route("/", _echo)]
    return TrailingSlashes(Starlette(routes=routes))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/chat/completions/", "/v1/chat/completions//"])
async def test_a_trailing_slash_reaches_the_route_with_its_body(app: TrailingSlashes, path: str) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://api.example") as client:
        reply = await client.post(path, content=b"{}")
    assert reply.status_code == 200 and reply.json() == {"path": "/v1/chat/completions", "body": "{}"}


async def test_the_root_keeps_its_slash(app: TrailingSlashes) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://api.example") as client:
        assert (await client.get("/")).status_code == 200
