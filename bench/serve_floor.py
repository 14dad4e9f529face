"""The floor Ray Serve sets under any gateway on it: time to the first streamed chunk through Serve's proxy
and one handle hop to a replica that answers at once (what the gateway's path is, with no work in it).

    python -m bench.serve_floor [--requests 30]

Starts Ray Serve on this machine (port 8000: stop any deployment first), runs the idle probe
(:mod:`bench.idle_probe`) against two apps in turn, and prints both:
- ``two_hops``: proxy, an ingress that reads the body, then a streamed handle call to a second deployment,
  the gateway's shape;
- ``one_hop``: proxy, then an ingress that streams itself.
Each stream sends 16 chunks, 1 ms apart. Compare with a raw vLLM server's idle TTFT on the same host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from bench.idle_probe import probe

MODELS = {"object": "list", "data": [{"id": "floor", "object": "model"}]}


def _chunk(index: int) -> str:
    return f"data: {json.dumps({'choices': [{'delta': {'content': f'x{index}'}}]})}\n\n"


async def _chunks(count: int) -> AsyncIterator[str]:
    for index in range(count):
        await asyncio.sleep(0.001)
        yield _chunk(index)


@serve.deployment
class InstantReplica:
    """Answers at once: a header, then the chunks (a replica's shape, without an engine)."""

    async def generate(self, count: int) -> AsyncIterator[dict | str]:
        yield {"status": 200}
        async for chunk in _chunks(count):
            yield chunk


@serve.deployment
class ForwardingIngress:
    """Reads the body, calls the replica (streamed), relays its chunks."""

    def __init__(self, replica: serve.handle.DeploymentHandle) -> None:
        self._replica = replica.options(stream=True)

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse(MODELS)
        body = await request.json()
        replies = self._replica.generate.remote(int(body.get("max_tokens", 16)))
        await replies.__anext__()  # the header

        async def relay() -> AsyncIterator[str]:
            async for chunk in replies:
                yield chunk
            yield "data: [DONE]\n\n"

        return StreamingResponse(relay(), media_type="text/event-stream")


@serve.deployment
class StreamingIngress:
    """Streams itself: the proxy's hop alone."""

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse(MODELS)
        body = await request.json()
        return StreamingResponse(_chunks(int(body.get("max_tokens", 16))), media_type="text/event-stream")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()
    apps = {"two_hops": ForwardingIngress.bind(InstantReplica.bind()), "one_hop": StreamingIngress.bind()}
    results = {}
    try:
        for name, app in apps.items():
            serve.run(app, name=name, route_prefix=f"/{name}")
            probe(f"http://127.0.0.1:8000/{name}", 3, 100, 16, None)  # warm up
            results[name] = probe(f"http://127.0.0.1:8000/{name}", args.requests, 100, 16, None)
            serve.delete(name)
    finally:
        serve.shutdown()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
