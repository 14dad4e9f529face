"""The gateway ingress: an OpenAI-compatible FastAPI app served by Ray Serve.

A request's life, one step per function: parse -> check the model -> classify (tenant, band, prompt
tokens, length class, cost) -> admit through the global queue and wait for a grant -> forward to exactly
the granted replica -> stream back -> account (release capacity, charge the tokens served, exactly once).
With the queue disabled, requests go straight to a replica through Serve's default router (the baseline).
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

from gateway.accounting import StreamUsage
from gateway.config import QueueConfig
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
from gateway.routing import GRANT_KWARG

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
async def _relay_stream(
    replies: DeploymentResponseGenerator, usage: StreamUsage | None = None, on_end: Any = None
) -> AsyncIterator[str]:
    """Relay the replica's SSE lines; on a replica failure end with an error event and [DONE].

    If the client goes away, Starlette cancels this generator; cancelling ``replies`` then propagates to
    the replica, which aborts the vLLM request. ``on_end`` (accounting) runs exactly once, however the
    stream ends.
    """
    try:
        async for line in replies:
            if usage is None or usage.observe(line):
                yield line
    except Exception as exc:  # the replica died or failed mid-stream
        logger.warning("stream from replica failed: %s", type(exc).__name__)
        error = error_body("The model replica failed during the stream.", "service_unavailable", "replica_failed")
        yield f"data: {json.dumps(error)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        replies.cancel()
        if on_end is not None:
            await on_end()


@serve.deployment
@serve.ingress(api)
class Gateway:
    """Ray Serve ingress deployment: validates OpenAI requests, admits them through the global queue, and
    forwards each to the replica its grant names."""

    def __init__(
        self,
        pools: dict[str, DeploymentHandle],
        served_model_name: str,
        model_path: str | None = None,
        queue: dict[str, Any] | None = None,
    ) -> None:
        if not pools:
            raise ValueError("the gateway needs at least one replica pool")
        self._pools = pools
        self._default_pool = next(iter(pools))
        self._served_model_name = served_model_name
        self._models_listing: dict[str, Any] | None = None
        preload_protocol_models()
        self._admission = None
        if queue is not None and queue.get("enabled", True):
            from gateway.admission import Admission

            self._admission = Admission(QueueConfig.model_validate(queue), model_path or "")

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
        return await self._serve(request, "chat")

    @api.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        """OpenAI (legacy) completions, streaming or not."""
        return await self._serve(request, "completion")

    async def _serve(self, request: Request, endpoint: Endpoint) -> Response:
        parsed = parse_request(await request.body(), endpoint)
        self._check_model(parsed)
        if self._admission is None:
            return await self._respond(self._forward(parsed, None), None)
        max_model_len = int((await self.list_models())["data"][0].get("max_model_len") or 0)
        ticket = await self._admission.classify(parsed, request.headers, max_model_len)
        return await self._admission.run(ticket, lambda grant: self._forward(ticket.parsed, grant), self._respond)

    def _check_model(self, parsed: ParsedRequest) -> None:
        if parsed.model != self._served_model_name:
            raise ModelNotFound(
                f"The model `{parsed.model}` does not exist; this gateway serves `{self._served_model_name}`.",
                param="model",
            )

    def _forward(self, parsed: ParsedRequest, replica_id: str | None) -> DeploymentResponseGenerator:
        pool = self._pools[self._default_pool]
        kwargs = {GRANT_KWARG: replica_id} if replica_id else {}
        return pool.options(stream=True).generate.remote(parsed.endpoint, parsed.body, **kwargs)

    @staticmethod
    async def _respond(replies: DeploymentResponseGenerator, accounting: Any) -> Response:
        """Turn the replica's reply into the HTTP response; ``accounting`` hears how it ended."""
        try:
            header = await replies.__anext__()
        except BaseException as exc:
            replies.cancel()
            if accounting is not None:
                await accounting.failed()
            if isinstance(exc, Exception):
                raise UpstreamUnavailable(f"The model replica failed: {type(exc).__name__}") from None
            raise
        if accounting is not None and accounting.misrouted(header):
            return await accounting.retry()
        if header["status"] != 200:
            if accounting is not None:
                await accounting.failed()
            raise from_vllm_error(header["body"])
        headers = accounting.response_headers() if accounting is not None else {}
        if not header["stream"]:
            if accounting is not None:
                await accounting.finished((header["body"].get("usage") or {}).get("total_tokens"))
            return JSONResponse(header["body"], headers=headers)
        usage = accounting.stream_usage() if accounting is not None else None
        on_end = accounting.stream_ended if accounting is not None else None
        return StreamingResponse(_relay_stream(replies, usage, on_end), media_type="text/event-stream",
                                 headers=headers)
