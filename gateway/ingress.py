"""The gateway ingress: an OpenAI-compatible FastAPI app served by Ray Serve.

A request's life, one step per function: authenticate (tenant) -> parse -> check the model -> read the
headers and decide the band (capped at the tenant's allowance) -> classify (prompt tokens, length class,
cost) -> rate-limit and admit through the global queue, wait for a grant -> forward to exactly the granted
replica of the granted pool -> stream back -> account (release capacity, charge the tokens served, exactly
once). With the queue disabled, requests go straight to their length class's pool through Serve's default router (the
baseline). Every response carries ``x-request-id`` (Ray Serve's proxy honours the client's or makes one).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.access import Access
from gateway.accounting import RequestOutcome, StreamUsage
from gateway.admission import band_headers
from gateway.classify import RequestClassifier
from gateway.config import AppConfig
from gateway.errors import (
    GatewayError,
    MethodNotAllowed,
    ModelNotFound,
    RouteNotFound,
    UpstreamUnavailable,
    error_body,
    from_vllm_error,
)
from gateway.headers import RequestHeaders, read_headers, request_id_of
from gateway.metrics import GatewayMetrics
from gateway.openapi import gateway_openapi
from gateway.request_parsing import Endpoint, ParsedRequest, parse_request, preload_protocol_models, read_body
from gateway.routing import GRANT_KWARG
from gateway.tenants import Tenant
from policies.placement import pool_for_class
from policies.priority import BandDecision
from policies.types import Grant

logger = logging.getLogger(__name__)

api = FastAPI(title="LLM gateway", description="OpenAI-compatible gateway in front of vLLM replica pools.")
api.openapi = lambda: gateway_openapi(api)  # type: ignore[method-assign]
CLIENT_GONE = 499  # the client went away before the reply (nginx's convention, for logs and metrics)


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
async def _relay_stream(replies: DeploymentResponseGenerator, usage: StreamUsage, on_end: Any) -> AsyncIterator[str]:
    """Relay the replica's SSE lines; on a replica failure end with an error event and [DONE].

    If the client goes away, Starlette cancels this generator; cancelling ``replies`` then propagates to
    the replica, which aborts the vLLM request. ``on_end`` (accounting) runs exactly once, however the
    stream ends.
    """
    try:
        async for line in replies:
            if usage.observe(line):
                yield line
    except Exception as exc:  # the replica died or failed mid-stream
        logger.warning("stream from replica failed: %s", type(exc).__name__)
        error = error_body("The model replica failed during the stream.", "service_unavailable", "replica_failed")
        yield f"data: {json.dumps(error)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        replies.cancel()
        await on_end()


@serve.deployment
@serve.ingress(api)
class Gateway:
    """Ray Serve ingress deployment: authenticates tenants, classifies and admits OpenAI requests through the
    global queue, and forwards each to the replica its grant names."""

    async def __init__(self, pools: dict[str, DeploymentHandle], config: dict[str, Any]) -> None:
        if not pools:
            raise ValueError("the gateway needs at least one replica pool")
        settings = AppConfig.model_validate(config)
        self._pools = pools
        self._default_pool = next(iter(pools))
        self._served_model_name = settings.model.name
        self._max_body_bytes = settings.gateway.max_body_bytes
        self._queue_config = settings.queue
        self._models_listing: dict[str, Any] | None = None
        self._access = Access(settings.access, settings.queue.band_names, settings.queue.default_band)
        self._classifier = RequestClassifier(settings.queue, settings.model.path)
        self._pool_for_class = {
            c.name: pool_for_class([(p.name, settings.pool_accepts(p), p.prefers) for p in settings.pools], c.name)
            for c in settings.queue.length_classes
        }
        self.metrics = GatewayMetrics(settings.metrics.tenant_labels)
        self._tenant_labels = settings.metrics.tenant_labels
        self._scrape_key_sha256 = settings.metrics.scrape_key_sha256
        preload_protocol_models()
        self._admission = None
        self._publisher = None
        self._gateway_id = ""
        if settings.queue.enabled:
            from gateway.admission import Admission
            from gateway.metrics_board import MetricsPublisher

            self._admission = Admission(settings.queue, self.metrics)
            session = await self._admission.session()
            self._gateway_id = session.owner
            self._board = session.metrics_board(ttl_s=3 * settings.metrics.publish_interval_s)
            self._publisher = MetricsPublisher(
                self._board, f"gateway:{session.owner}", {"gateway": session.owner},
                lambda: generate_latest(self.metrics.registry), settings.metrics.publish_interval_s,
            )
            self._publisher.start()

    @api.get("/health")
    async def health(self) -> dict[str, str]:
        """Liveness of the gateway itself."""
        return {"status": "ok"}

    @api.get("/metrics")
    async def prometheus_metrics(self, request: Request) -> Response:
        """Prometheus exposition: every gateway's and replica's series and the global queue's gauges."""
        Access.check_scrape_key(request.headers, self._scrape_key_sha256)
        body = generate_latest(self.metrics.registry)
        if self._publisher is not None:
            from gateway.metrics_board import render_fleet

            try:
                await self._publisher.publish_now()
                session = await self._admission.session()  # type: ignore[union-attr]
                entries, snapshot = await self._board.read(), await session.queue.snapshot()
                body = await asyncio.to_thread(render_fleet, entries, snapshot, self._tenant_labels)
            except Exception as exc:  # Redis down: this gateway's own series are still worth a scrape
                logger.warning("fleet metrics unavailable (%s); serving this gateway's own", type(exc).__name__)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @api.get("/v1/models")
    async def list_models(self, request: Request) -> dict[str, Any]:
        """vLLM's model listing (fetched from a replica once, then cached)."""
        self._access.authenticate(request.headers)
        return await self._listing()

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        """OpenAI chat completions, streaming or not."""
        return await self._serve(request, "chat")

    @api.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        """OpenAI (legacy) completions, streaming or not."""
        return await self._serve(request, "completion")

    async def _serve(self, request: Request, endpoint: Endpoint) -> Response:
        arrived = time.monotonic()
        tenant_id, band, status = "", "", 500
        try:
            tenant = self._access.authenticate(request.headers)
            tenant_id = tenant.id
            parsed = parse_request(await read_body(request, self._max_body_bytes), endpoint)
            self._check_model(parsed)
            self._access.check_model(tenant, parsed.model)
            asked = read_headers(request.headers, self._queue_config.band_names, self._queue_config.objectives)
            decision = self._access.band(tenant, asked)
            band = decision.band
            if decision.capped:
                self.metrics.capped.labels(self.metrics.tenant(tenant_id), decision.requested, band).inc()
            response = await self._dispatch(parsed, tenant, decision, asked, arrived)
            status = response.status_code
            return response
        except GatewayError as exc:
            status = exc.status
            if self._gateway_id:
                exc.headers.setdefault("x-fleetgate-gateway", self._gateway_id)
            raise
        except asyncio.CancelledError:
            status = CLIENT_GONE
            raise
        finally:
            self.metrics.requests.labels(self.metrics.tenant(tenant_id), band, str(status)).inc()
            logger.info("request %s tenant=%s band=%s status=%s %.0f ms", request_id_of(request.headers), tenant_id or "-",
                        band or "-", status, (time.monotonic() - arrived) * 1000)

    async def _dispatch(self, parsed: ParsedRequest, tenant: Tenant, decision: BandDecision,
                        asked: RequestHeaders, arrived: float) -> Response:
        max_model_len = int((await self._listing())["data"][0].get("max_model_len") or 0)
        size = await self._classifier.classify(parsed, max_model_len)
        if self._admission is None:  # the baseline: no global queue; the class's pool, Serve's default router
            parsed.body["priority"] = self._queue_config.vllm_priority(decision.band)
            pool = self._pool_for_class[size.length_class]
            headers = {"x-fleetgate-band": decision.band, "x-fleetgate-length-class": size.length_class,
                       "x-fleetgate-prompt-tokens": str(size.prompt_tokens), "x-fleetgate-pool": pool}
            outcome = RequestOutcome(self.metrics, tenant.id, decision.band, arrived,
                                     headers | band_headers(decision), size.prompt_tokens)
            replies = self._pools[pool].options(stream=True).generate.remote(parsed.endpoint, parsed.body)
            return await self._respond(replies, outcome)
        ticket = await self._admission.ticket(parsed, tenant, decision, asked, size, arrived)
        return await self._admission.run(ticket, lambda grant: self._forward(ticket.parsed, grant), self._respond)

    async def _listing(self) -> dict[str, Any]:
        if self._models_listing is None:
            try:
                self._models_listing = await self._pools[self._default_pool].models.remote()
            except Exception as exc:
                raise UpstreamUnavailable(f"No replica answered the model listing: {type(exc).__name__}")
        return self._models_listing

    def _check_model(self, parsed: ParsedRequest) -> None:
        if parsed.model != self._served_model_name:
            raise ModelNotFound(
                f"The model `{parsed.model}` does not exist; this gateway serves `{self._served_model_name}`.",
                param="model",
            )

    def _forward(self, parsed: ParsedRequest, grant: Grant) -> DeploymentResponseGenerator:
        # a pool this gateway does not know (config drift) reaches the default pool, which answers misrouted
        pool = self._pools.get(grant.pool) or self._pools[self._default_pool]
        return pool.options(stream=True).generate.remote(parsed.endpoint, parsed.body, **{GRANT_KWARG: grant.replica_id})

    @staticmethod
    async def _respond(replies: DeploymentResponseGenerator, outcome: RequestOutcome) -> Response:
        """Turn the replica's reply into the HTTP response; ``outcome`` hears how it ended."""
        try:
            header = await replies.__anext__()
        except BaseException as exc:
            replies.cancel()
            await outcome.failed()
            if isinstance(exc, Exception):
                raise UpstreamUnavailable(f"The model replica failed: {type(exc).__name__}") from None
            raise
        if outcome.misrouted(header):
            return await outcome.retry()
        if header["status"] != 200:
            await outcome.failed()
            raise from_vllm_error(header["body"])
        if not header["stream"]:
            await outcome.finished((header["body"].get("usage") or {}).get("total_tokens"))
            return JSONResponse(header["body"], headers=outcome.response_headers())
        return StreamingResponse(_relay_stream(replies, outcome.stream_usage(), outcome.stream_ended),
                                 media_type="text/event-stream", headers=outcome.response_headers())
