"""The gateway ingress: an OpenAI-compatible FastAPI app served by Ray Serve.

Routes and wiring only: a completion request's whole path is :class:`gateway.lifecycle.RequestLifecycle`.
Every response carries ``x-request-id`` (Ray Serve's proxy honours the client's or makes one).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from fleet.loop_lag import LoopLagMonitor
from fleet.metrics_board import MetricsBoard, MetricsPublisher
from gateway.access import Access
from gateway.admission import QueueAdmission, admission_for
from gateway.classify import RequestClassifier
from gateway.config import AppConfig
from gateway.errors import GatewayError, MethodNotAllowed, RouteNotFound, error_body
from gateway.http_guard import guard_installed, missing_guard_advice
from gateway.body_parser import BodyParser
from gateway.lifecycle import RequestLifecycle
from gateway.metrics import GatewayMetrics
from gateway.metrics_render import render_fleet
from gateway.model_listing import model_entry, visible_listing
from gateway.open_requests import OpenRequests
from gateway.openapi import gateway_openapi
from gateway.pools import Pools
from gateway.request_parsing import ClientOptions, preload_protocol_models
from gateway.trailing_slashes import TrailingSlashes

logger = logging.getLogger(__name__)

api = FastAPI(title="LLM gateway", description="OpenAI-compatible gateway in front of vLLM replica pools.")
api.openapi = lambda: gateway_openapi(api)  # type: ignore[method-assign]
api.add_middleware(TrailingSlashes)


@api.exception_handler(GatewayError)
async def _gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
    return exc.response()


@api.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow")
        response = MethodNotAllowed(f"Method not allowed for this endpoint (it takes {allowed})." if allowed
                                    else "Method not allowed for this endpoint.").response()
        if allowed:
            response.headers["Allow"] = allowed  # RFC 9110: a 405 names the methods the endpoint takes
        return response
    if exc.status_code == 404:
        return RouteNotFound(f"No such endpoint. This gateway serves {_served_endpoints()}.").response()
    return JSONResponse(error_body(str(exc.detail), "invalid_request_error", None), status_code=exc.status_code)


@functools.cache
def _served_endpoints() -> str:
    """The API's endpoints, as a 404 names them (``POST /v1/chat/completions, ...``)."""
    routes = [r for r in api.routes if isinstance(r, APIRoute) and r.include_in_schema]
    return ", ".join(f"{'/'.join(sorted(r.methods - {'HEAD'}))} {re.sub(r':[a-z]+}', '}', r.path)}" for r in routes)


@api.exception_handler(Exception)
async def _unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    logger.exception("unexpected gateway error: %s", type(exc).__name__)
    return JSONResponse(error_body("Internal gateway error.", "internal_error", None), status_code=500)


@serve.deployment
@serve.ingress(api)
class Gateway:
    """Ray Serve ingress deployment: authenticates tenants, classifies and admits OpenAI requests through the
    global queue, and forwards each to the replica its grant names."""

    async def __init__(self, pools: dict[str, DeploymentHandle], config: dict[str, Any]) -> None:
        settings = AppConfig.model_validate(config)
        self._pools = Pools(pools)
        self.metrics = GatewayMetrics(settings.metrics.tenant_labels, settings.metrics.max_tenant_labels)
        self._access = Access(settings.access, settings.queue.band_names, settings.queue.default_band)
        self._loop_lag = LoopLagMonitor(self.metrics.loop_lag.observe)
        self._loop_lag.start()
        self.metrics.tenants_file_stale.set_function(lambda: float(self._access.tenants.reload_failed is not None))
        if not guard_installed():
            self.metrics.header_guard_missing.set(1)
            logger.warning(missing_guard_advice())
        self._settings = settings
        preload_protocol_models()
        self._body_parser = BodyParser(settings.gateway.dense_body_values)
        await self._body_parser.start()
        self._admission = admission_for(settings.queue, settings.pool_plan(), self.metrics,
                                        max(pool.graceful_shutdown_timeout_s for pool in settings.pools))
        await self._admission.start()
        classifier = RequestClassifier(settings.queue, settings.model.path, settings.sequence_limit(),
                                       settings.gateway.max_prompt_logprob_entries,
                                       settings.gateway.max_output_logprob_entries, settings.replica_engine_args(),
                                       settings.gateway.control_tokens_in_messages == "refuse")
        open_requests = OpenRequests(settings.gateway.max_ongoing_requests, settings.gateway.crowded_share)
        self.metrics.open_requests.set_function(lambda: float(open_requests.total))
        self._lifecycle = RequestLifecycle(
            served_model_name=settings.model.name, max_body_bytes=settings.gateway.max_body_bytes,
            queue=settings.queue, access=self._access, classifier=classifier,
            admission=self._admission, pools=self._pools, metrics=self.metrics, body_parser=self._body_parser,
            open_requests=open_requests,
            client_options=ClientOptions(frozenset(settings.model.chat_template_options),
                                         frozenset(settings.model.extension_args),
                                         settings.gateway.max_structured_output_bytes,
                                         settings.gateway.max_chat_items),
        )
        self._board: MetricsBoard | None = None
        self._publisher: MetricsPublisher | None = None
        if isinstance(self._admission, QueueAdmission):
            session = await self._admission.session()
            interval_s = settings.metrics.publish_interval_s
            self._board = session.metrics_board(ttl_s=3 * interval_s)
            self._publisher = MetricsPublisher(self._board, f"gateway:{session.owner}", {"gateway": session.owner},
                                               lambda: generate_latest(self.metrics.registry), interval_s)
            self._publisher.start()

    @api.api_route("/health", methods=["GET", "HEAD"])
    async def health(self) -> dict[str, str]:
        """Liveness of the gateway itself (HEAD too, as some load balancers probe)."""
        return {"status": "ok"}

    @api.get("/metrics")
    async def prometheus_metrics(self, request: Request) -> Response:
        """Prometheus exposition: every gateway's and replica's series and the global queue's gauges."""
        Access.check_scrape_key(request.headers, self._settings.metrics.scrape_key_sha256)
        if self._publisher is not None and self._board is not None:
            try:
                await self._publisher.publish_now()
                session = await self._admission.session()  # type: ignore[union-attr]
                entries, snapshot = await self._board.read(), await session.queue.snapshot()
                metrics = self._settings.metrics
                body = await asyncio.to_thread(render_fleet, entries, snapshot, metrics.tenant_labels,
                                               metrics.max_tenant_labels)
                return Response(body, media_type=CONTENT_TYPE_LATEST)
            except Exception as exc:  # Redis down: this gateway's own series are still worth a scrape
                logger.warning("fleet metrics unavailable (%s); serving this gateway's own", type(exc).__name__)
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @api.get("/v1/models")
    async def list_models(self, request: Request) -> dict[str, Any]:
        """vLLM's model listing (fetched from a replica once, then cached), as far as the tenant may call."""
        tenant = self._access.authenticate(request.headers)
        return visible_listing(await self._pools.listing(), tenant)

    @api.get("/v1/models/{model_id:path}")
    async def retrieve_model(self, model_id: str, request: Request) -> dict[str, Any]:
        """One model of the listing (OpenAI's retrieve-model call)."""
        tenant = self._access.authenticate(request.headers)
        return model_entry(await self._pools.listing(), tenant, model_id)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        """OpenAI chat completions, streaming or not."""
        return await self._lifecycle.handle(request, "chat")

    @api.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        """OpenAI (legacy) completions, streaming or not."""
        return await self._lifecycle.handle(request, "completion")
