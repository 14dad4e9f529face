"""The gateway ingress: an OpenAI-compatible FastAPI app served by Ray Serve.

One request's life is one readable path: parse -> check the model -> forward to a replica pool -> stream
back. Later steps (authenticate, classify, admit through the global queue, account) slot in between.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.errors import (
    GatewayError,
    MethodNotAllowed,
    ModelNotFound,
    RouteNotFound,
    UpstreamUnavailable,
    error_body,
    from_vllm_error,
)
from gateway.request_parsing import Endpoint, ParsedRequest, parse_request, preload_protocol_models

logger = logging.getLogger(__name__)

api = FastAPI(title="LLM gateway", description="OpenAI-compatible gateway in front of vLLM replica pools.")


@api.exception_handler(GatewayError)
async def _gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
    return exc.response()


@api.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 405:
        return MethodNotAllowed("Method not allowed for this endpoint.").response()
    if exc.status_code == 404:
        return RouteNotFound("No such endpoint.").response()
    return JSONResponse(error_body(str(exc.detail), "invalid_request_error", None), status_code=exc.status_code)


@api.exception_handler(Exception)
async def _unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    logger.exception("unexpected gateway error: %s", type(exc).__name__)
    return JSONResponse(error_body("Internal gateway error.", "internal_error", None), status_code=500)


# Defined before the deployment class: Serve serialises the class when it is decorated.
async def _relay_stream(replies: DeploymentResponseGenerator) -> AsyncIterator[str]:
    """Relay the replica's SSE lines; on a replica failure end with an error event and [DONE].

    If the client goes away, Starlette cancels this generator; cancelling ``replies`` then propagates to
    the replica, which aborts the vLLM request.
    """
    try:
        async for line in replies:
            yield line
    except Exception as exc:  # the replica died or failed mid-stream
        logger.warning("stream from replica failed: %s", type(exc).__name__)
        error = error_body("The model replica failed during the stream.", "service_unavailable", "replica_failed")
        yield f"data: {json.dumps(error)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        replies.cancel()


@serve.deployment
@serve.ingress(api)
class Gateway:
    """Ray Serve ingress deployment: validates OpenAI requests and forwards them to vLLM replica pools."""

    def __init__(self, pools: dict[str, DeploymentHandle], served_model_name: str) -> None:
        if not pools:
            raise ValueError("the gateway needs at least one replica pool")
        self._pools = pools
        self._default_pool = next(iter(pools))
        self._served_model_name = served_model_name
        self._models_listing: dict[str, Any] | None = None
        preload_protocol_models()

    @api.get("/health")
    async def health(self) -> dict[str, str]:
        """Liveness of the gateway itself."""
        return {"status": "ok"}

    @api.get("/v1/models")
    async def list_models(self) -> dict[str, Any]:
        """vLLM's model listing (fetched from a replica once, then cached)."""
        if self._models_listing is None:
            try:
                self._models_listing = await self._pools[self._default_pool].models.remote()
            except Exception as exc:
                raise UpstreamUnavailable(f"No replica answered the model listing: {type(exc).__name__}")
        return self._models_listing

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        """OpenAI chat completions, streaming or not."""
        return await self._serve(await request.body(), "chat")

    @api.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        """OpenAI (legacy) completions, streaming or not."""
        return await self._serve(await request.body(), "completion")

    async def _serve(self, raw_body: bytes, endpoint: Endpoint) -> Response:
        parsed = parse_request(raw_body, endpoint)
        self._check_model(parsed)
        replies = self._forward(parsed)
        try:
            header = await replies.__anext__()
        except BaseException as exc:
            replies.cancel()
            if isinstance(exc, Exception):
                raise UpstreamUnavailable(f"The model replica failed: {type(exc).__name__}") from None
            raise
        if header["status"] != 200:
            raise from_vllm_error(header["body"])
        if not header["stream"]:
            return JSONResponse(header["body"])
        return StreamingResponse(_relay_stream(replies), media_type="text/event-stream")

    def _check_model(self, parsed: ParsedRequest) -> None:
        if parsed.model != self._served_model_name:
            raise ModelNotFound(
                f"The model `{parsed.model}` does not exist; this gateway serves `{self._served_model_name}`.",
                param="model",
            )

    def _forward(self, parsed: ParsedRequest) -> DeploymentResponseGenerator:
        pool = self._pools[self._default_pool]
        return pool.options(stream=True).generate.remote(parsed.endpoint, parsed.body)
