"""A request's life, top to bottom: authenticate -> parse -> classify -> admit -> forward -> relay -> settle.

:meth:`RequestLifecycle.handle` is the whole path of a completion request. Admission is a strategy (the
global queue, or the direct no-queue baseline), so the path is the same for both. Whatever happens after
admission, the request's :class:`Settlement` runs exactly once: from the ``finally`` of
:meth:`RequestLifecycle._forward_and_relay` for a reply that is not streamed (or failed), and when a
streamed response is done with, even one that never started.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from ray.serve.handle import DeploymentResponseGenerator

from fleet.config import QueueConfig
from gateway.access import Access
from gateway.accounting import Settlement, StreamUsage, reported_tokens, run_apart
from gateway.admission import AdmissionRequest, AdmissionStrategy, Admitted
from gateway.classify import Classification, RequestClassifier
from gateway.errors import (
    GatewayError, GrantLost, InvalidValue, TooManyOpenRequests, UpstreamUnavailable, from_vllm_error,
)
from gateway.headers import read_headers, request_id_of
from gateway.metrics import GatewayMetrics
from gateway.model_listing import check_served
from gateway.open_requests import OpenRequests
from gateway.pools import Pools
from gateway.relay import SettlingStreamingResponse, relay_lines
from gateway.body_parser import BodyParser
from gateway.request_parsing import ClientOptions, Endpoint, ParsedRequest, read_body
from gateway.response_headers import classification_headers
from gateway.stages import Stages, first_token_parts
from replicas.base import MISROUTED, NO_GRANT

logger = logging.getLogger(__name__)

CLIENT_GONE = 499  # the client went away before the reply (nginx's convention, for logs and metrics)
SERVED_WAIT_S = 4.0  # how long a replica may take to say what a request cut short served


class RequestLifecycle:
    """Serves completion requests for one gateway replica."""

    def __init__(self, *, served_model_name: str, max_body_bytes: int, queue: QueueConfig, access: Access,
                 classifier: RequestClassifier, admission: AdmissionStrategy, pools: Pools,
                 metrics: GatewayMetrics, body_parser: BodyParser, open_requests: OpenRequests,
                 client_options: ClientOptions = ClientOptions(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._served_model_name, self._max_body_bytes, self._queue = served_model_name, max_body_bytes, queue
        self._client_options, self._body_parser = client_options, body_parser
        self._isolate_cache = access.config.isolate_prefix_cache
        self._access, self._classifier, self._admission = access, classifier, admission
        self._pools, self._metrics, self._clock = pools, metrics, clock
        self._open = open_requests

    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        """Answer one completion request (the errors a client can see are raised as GatewayError)."""
        arrived = self._clock()
        stages = Stages(self._metrics, self._clock, arrived)
        tenant_id, band, status = "", "", 500
        close: Callable[[], None] | None = None  # closes this request's count in OpenRequests
        try:
            tenant = self._access.authenticate(request.headers)
            tenant_id = tenant.id
            self._admission.check_held(tenant.id)  # past its rate limit: refused before its body is read
            close = self._open_for(tenant.id)
            parsed = await self._body_parser.parse(await read_body(request, self._max_body_bytes), endpoint,
                                                   self._client_options)
            stages.lap("parse")
            check_served(parsed.model, self._served_model_name, tenant)
            self._access.check_model(tenant, parsed.model)
            asked = read_headers(request.headers, self._queue.band_names, self._queue.objectives)
            decision = self._access.band(tenant, asked)
            band = decision.band
            _check_beam_search(parsed, self._queue.vllm_priority(band))
            if decision.capped:
                self._metrics.capped.labels(self._metrics.tenant(tenant_id), decision.requested, band).inc()
            stages.lap("authorise")
            size = await self._classifier.classify(parsed, await self._pools.max_model_len())
            client_usage = _prepare_body(parsed, self._queue.vllm_priority(band),
                                         cache_salt(tenant.id) if self._isolate_cache else None)
            stages.lap("count_tokens")
            admission = AdmissionRequest(parsed, tenant, decision, asked, size, arrived)
            place = await self._admission.admit(admission)
            stages.laps(place.stages)
            response = await self._forward_and_relay(admission, place, client_usage, stages, close)
            if isinstance(response, SettlingStreamingResponse):
                close = None  # open until the stream is done with: its end closes it
            status = response.status_code
            return response
        except GatewayError as exc:
            status = exc.status
            if self._admission.gateway_id:
                exc.headers.setdefault("x-fleetgate-gateway", self._admission.gateway_id)
            raise
        except asyncio.CancelledError:
            status = CLIENT_GONE
            raise
        finally:
            if close is not None:
                close()
            self._metrics.requests.labels(self._metrics.tenant(tenant_id), band, str(status)).inc()
            logger.info("request %s tenant=%s band=%s status=%s %.0f ms", request_id_of(request.headers),
                        tenant_id or "-", band or "-", status, (self._clock() - arrived) * 1000)

    def _open_for(self, tenant_id: str) -> Callable[[], None]:
        """Count the request as open for ``tenant_id`` on this replica, or raise the 429 of a crowded one."""
        try:
            return self._open.open(tenant_id)
        except TooManyOpenRequests as exc:
            self._metrics.rejections.labels(self._metrics.tenant(tenant_id), "", exc.reason).inc()
            raise

    async def _forward_and_relay(self, admission: AdmissionRequest, place: Admitted, client_usage: tuple[bool, bool],
                                 stages: Stages, close: Callable[[], None] | None = None) -> Response:
        settlement = Settlement(self._metrics, admission.tenant.id, admission.decision.band, admission.arrived,
                                place, self._clock)
        served, streaming, at_engine, apart = 0, False, [False], False
        try:
            try:
                header, replies, call_s = await self._forward(admission.parsed, place, at_engine)
            except asyncio.CancelledError:
                if at_engine[0]:  # work that ran is never refunded: charged what the engine did, apart
                    apart = True
                    await self._settle_apart(settlement, place, admission.size)
                raise
            if header["status"] != 200:
                served = int(header.get("served") or 0)  # an engine that failed it may have worked for it
                raise from_vllm_error(header["status"], header["body"])
            headers = classification_headers(admission.decision, admission.size, place.pool, place.queue_ms,
                                              self._admission.gateway_id)
            stages.parts(first_token_parts(header.get("timings"), call_s))
            headers["server-timing"] = stages.server_timing()  # up to the engine's answer
            if not header["stream"]:
                stages.lap("first_token")
                served = reported_tokens(header["body"], admission.size.prompt_tokens)
                return JSONResponse(header["body"], headers=headers)
            usage = StreamUsage(admission.size.prompt_tokens, client_usage[0], self._clock, client_usage[1])

            async def on_exit() -> None:
                if close is not None:
                    close()
                replies.cancel()
                if usage.chunk_times:
                    stages.lap("first_token", at=usage.chunk_times[0])
                    stages.lap("relay")
                served_tokens = usage.total_tokens
                if not usage.finished:  # cut: the replica may have read more of it than it relayed
                    served_tokens = max(served_tokens, await self._served_by_cut_stream(place))
                await settlement.settle(served_tokens, usage.chunk_times)

            streaming = True
            return SettlingStreamingResponse(relay_lines(replies, usage), on_exit, headers)
        finally:
            if not streaming and not apart:
                await settlement.settle(served)

    async def _forward(self, parsed: ParsedRequest, place: Admitted,
                       at_engine: list[bool]) -> tuple[dict[str, Any], DeploymentResponseGenerator, float]:
        """Start the request where its place says; a replica that is gone sends it back to be placed again.
        ``at_engine[0]`` is True while a replica holds it. Returns the reply's header, the rest of the reply,
        and the seconds from the (last) call to its header."""
        while True:
            called = self._clock()
            replies = self._pools.call(place.pool, place.replica_id, parsed, place.ticket_id, place.prompt_tokens,
                                       place.charged)
            try:
                at_engine[0] = True
                header = await replies.__anext__()
            except Exception as exc:
                replies.cancel()
                raise UpstreamUnavailable(f"The model replica failed: {type(exc).__name__}") from None
            except BaseException:
                replies.cancel()
                raise
            if header["status"] == NO_GRANT:
                replies.cancel()
                raise GrantLost()
            if header["status"] != MISROUTED:
                return header, replies, self._clock() - called
            at_engine[0] = False
            await place.requeue()

    async def _settle_apart(self, settlement: Settlement, place: Admitted, size: Classification) -> None:
        """The client left while a replica held its request: ask what its engine served and settle, in a task
        of its own, outside the cancelled request. Ray Serve cancels the handle calls a cancelled request makes
        (so the ask runs in a fresh context, not as that request's child), and it may cancel the request again
        while it waits (the task goes on and settles)."""
        async def ask_then_settle() -> None:
            await settlement.settle(await self._served_after_client_left(place, size))

        await run_apart(ask_then_settle(), context=contextvars.Context())

    async def _served_by_cut_stream(self, place: Admitted) -> int:
        """A stream cut before its end: the engine's latest count as its replica read it, lines it held back
        for batching included (0 when it cannot say in time: the relayed count stands)."""
        return await self._served_as_replica_recorded(place, "a cut stream") or 0

    async def _served_after_client_left(self, place: Admitted, size: Classification) -> int:
        """The client left while a replica held its request (Ray Serve cancels the replica's call with the
        client's): the tokens its engine served, as the replica recorded them. Work that ran is never refunded:
        the request's estimate when the replica cannot say (no grant names it, a stream cut before its first
        line, no answer within SERVED_WAIT_S)."""
        served = await self._served_as_replica_recorded(place, "a cancelled request")
        return size.cost if served is None else served

    async def _served_as_replica_recorded(self, place: Admitted, what: str) -> int | None:
        """The tokens the granted replica recorded for the call of ``place`` once it ended; None when no grant
        names a replica, or it does not say within SERVED_WAIT_S. Asked in a context of its own: Ray Serve
        cancels the handle calls of a cancelled request, and a client that left cancelled this one."""
        if place.replica_id is None or place.ticket_id is None:
            return None
        ask = asyncio.get_running_loop().create_task(
            self._pools.served(place.pool, place.replica_id, place.ticket_id, SERVED_WAIT_S),
            context=contextvars.Context())
        try:
            return await asyncio.wait_for(ask, SERVED_WAIT_S + 1)
        except Exception as exc:
            logger.warning("a replica did not say what %s served: %s", what, type(exc).__name__)
            return None

def _check_beam_search(parsed: ParsedRequest, vllm_priority: int) -> None:
    """vLLM runs beam search at priority 0 whatever the request's priority (its beam path passes none), so a
    beam search of a lower band would run ahead of the top band's work: only the top band may ask for one."""
    if parsed.body.get("use_beam_search") and vllm_priority != 0:
        raise InvalidValue("use_beam_search: vLLM runs beam search at the top priority whatever the band, so it is "
                           "allowed only in the top band.", param="use_beam_search")


def cache_salt(tenant_id: str) -> str:
    """The tenant's own prefix-cache salt: requests of different tenants never share cached blocks."""
    return hashlib.sha256(f"fleetgate-tenant:{tenant_id}".encode()).hexdigest()[:32]


def _prepare_body(parsed: ParsedRequest, vllm_priority: int, salt: str | None = None) -> tuple[bool, bool]:
    """Give the body its band's vLLM priority (a client's own is overwritten), the tenant's cache salt when
    prefix caches are isolated (likewise), and, for a stream, always ask vLLM for usage in every chunk and at
    the end (tenants are charged by the engine's count); returns whether the client asked for the final
    usage chunk, and for usage in every chunk."""
    parsed.body["priority"] = vllm_priority
    if salt is not None:
        parsed.body["cache_salt"] = salt
    asked = parsed.body.get("stream_options") or {}
    if parsed.stream:
        parsed.body["stream_options"] = {**asked, "include_usage": True, "continuous_usage_stats": True}
    return bool(asked.get("include_usage")), bool(asked.get("continuous_usage_stats"))
