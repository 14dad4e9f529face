"""What every replica deployment shares: its reply format, the misroute check, and joining the fleet.

The gateway calls :meth:`ReplicaBase.generate` with a plain request body and the replica its grant names;
the first message of every reply is a :class:`ReplicaReply` header, then (for streams) the SSE lines.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Literal

from pydantic import BaseModel

from fleet.capacity import CapacityRegistration
from fleet.signal_reporter import SignalReporter
from policies.placement import guarded_classes
from policies.types import EngineSignals, ReplicaCapacity
from replicas.call_outcomes import CallOutcomes
from replicas.engine_signals import RequestTracker
from replicas.spec import ReplicaSpec
from replicas.stream_batching import batched_lines
from replicas.stream_usage import LatestUsage

Endpoint = Literal["chat", "completion"]
MISROUTED = 421  # "misdirected request": the call reached a replica other than the granted one
NO_GRANT = 403  # with the global queue on, a call must carry a grant the queue made to this replica
GIVEN_UP = 499  # the gateway gave the call up (its client left) before it arrived: nothing ran


class ReplicaReply(BaseModel):
    """First message of every reply: the HTTP status, and either the full JSON body or ``stream=True``."""

    status: int
    body: dict[str, Any] | None = None
    stream: bool = False
    served: int | None = None  # for an error: the tokens its engine served all the same (None: none)
    timings: dict[str, float] | None = None  # seconds: where the replica's part of the wait went (below)


class ReplicaBase:
    """A Ray Serve replica that serves one engine; subclasses implement :meth:`serve`, :meth:`engine_signals`,
    ``models`` and ``check_health``.

    With the global queue, the replica registers its capacity and reports its engine's signals
    (:class:`fleet.signal_reporter.SignalReporter`): a subclass calls :meth:`engine_stepped` after each engine
    step. Every request gets a key of the replica's own (:class:`replicas.engine_signals.RequestTracker`),
    which is also its engine request id.
    """

    spec: ReplicaSpec
    replica_id: str
    tracker: RequestTracker
    _registration: CapacityRegistration | None = None
    _reporter: SignalReporter | None = None
    _left = False

    def _adopt(self, spec: ReplicaSpec) -> None:
        self.spec = spec
        self.replica_id = serve_replica_id()
        self.tracker = RequestTracker()
        self.outcomes = CallOutcomes()
        self._served_when_cut: dict[str, int | None] = {}
        self._engine_at_cut: dict[str, int | None] = {}  # a cut stream's engine count, read before the abort

    async def _join_fleet(self, slots: int, kv_tokens: int, step_tokens: int, prefill_chunk: int,
                          publish_metrics: bool) -> ReplicaCapacity:
        """Register this replica's capacity with the global queue (when there is one), keep it alive, and
        start reporting its engine's signals. ``step_tokens`` is the engine's budget per step and
        ``prefill_chunk`` the most prompt tokens one request takes of it (0: the whole budget)."""
        self.tracker.prefill_chunk = prefill_chunk or step_tokens
        queue = self.spec.queue
        order = [c.name for c in queue.length_classes] if queue is not None else []
        capacity = ReplicaCapacity(replica_id=self.replica_id, slots_total=slots, tokens_total=kv_tokens,
                                   accepts=frozenset(self.spec.accepts), prefers=frozenset(self.spec.prefers),
                                   guarded=guarded_classes(self.spec.accepts, self.spec.prefers, order),
                                   pool=self.spec.pool, step_tokens=step_tokens, prefill_chunk=prefill_chunk,
                                   reserve=self.spec.reserve)
        if queue is not None:
            self._registration = CapacityRegistration(queue, capacity)
            await self._registration.start()
            self._reporter = SignalReporter(self._registration.queue, self.replica_id, self.engine_signals,
                                            queue.signal_interval_s, queue.signal_heartbeat_s,
                                            read_progress=self.engine_progress,
                                            progress_interval_s=queue.progress_interval_s)
            self._reporter.start()
            if publish_metrics:
                self._registration.publish_metrics(self.spec.metrics_interval_s)
        return capacity

    def engine_stepped(self) -> None:
        """The engine finished a step (its signals may have changed)."""
        if self._reporter is not None:
            self._reporter.notify()

    def engine_signals(self) -> EngineSignals:
        """The engine's signals now."""
        raise NotImplementedError

    def engine_served(self) -> dict[str, int]:
        """Tokens the engine has served so far for each request it holds (key -> prompt and output tokens)."""
        return {}

    def engine_progress(self) -> list[tuple[str, int]]:
        """(ticket, tokens served so far) of the granted requests that ran past what their tenants were charged."""
        return self.tracker.progress(self.engine_served())

    async def generate(
        self, endpoint: Endpoint, body: dict[str, Any], granted_replica: str | None = None,
        ticket_id: str | None = None, prompt_tokens: int = 0, charged: int = 0, **later: Any,
    ) -> AsyncIterator[dict[str, Any] | str]:
        """Run one request; yield a ReplicaReply dict, then SSE lines if the reply streams.

        ``granted_replica`` is the replica the global queue granted the request to; a call that reaches
        another replica (the granted one is gone) is answered MISROUTED at once, and the gateway requeues.
        ``ticket_id`` names the grant: its arrival is acknowledged in the next signal report. ``prompt_tokens``
        is the gateway's count, what the request weighs until its engine starts it; ``charged`` what the grant
        charged its tenant (the engine's progress past it is reported, and charged, as it runs). ``later``:
        arguments a newer gateway passes that this release does not know, ignored, so that gateways and replicas
        of two releases work together during a rolling update.
        """
        entered = time.monotonic()
        if granted_replica is not None and granted_replica != self.replica_id:
            yield ReplicaReply(status=MISROUTED).model_dump()
            return
        if self._registration is not None and not await self._holds_grant(ticket_id):
            yield ReplicaReply(status=NO_GRANT, body=_no_grant()).model_dump()
            return
        if ticket_id is not None and not self.outcomes.begin(ticket_id):
            yield ReplicaReply(status=GIVEN_UP).model_dump()
            return
        grant_check = time.monotonic() - entered
        key = self.tracker.enter(prompt_tokens, ticket_id, charged)
        body["request_id"] = key  # the engine's id for it: the replica's own, never the client's
        if ticket_id is not None and self._reporter is not None:
            self._reporter.received(ticket_id)
        served: int | None = None
        replies = LatestUsage(self.serve(endpoint, body))
        try:
            first = True
            interval_s = self.spec.stream_batching_interval_ms / 1000 if body.get("stream") else 0.0
            on_cut = functools.partial(self._stream_cut, key) if body.get("stream") else None
            async for message in batched_lines(aiter(replies), interval_s, on_cut=on_cut):
                if first and isinstance(message, str):  # the stream's first line: the engine has started it
                    self.tracker.started(key)
                    first = False
                elif isinstance(message, dict):
                    served = _served_in(message)
                    if message.get("timings") is not None:  # the header: what its wait went on, here
                        message["timings"].update(grant_check=grant_check, replica=time.monotonic() - entered)
                yield message
        finally:
            at_cut = self._engine_at_cut.pop(key, None)
            if ticket_id is not None:  # a stream: the engine's latest count, lines held for batching included
                seen = self._served_when_cut.pop(key, served if served is not None else replies.total_tokens())
                known = [count for count in (seen, at_cut) if count is not None]
                self.outcomes.end(ticket_id, max(known) if known else None)
            self.tracker.leave(key)
            self.engine_stepped()  # an abort changes the engine's state without a step

    async def served(self, ticket_id: str, timeout_s: float, granted_replica: str | None = None,
                     **later: Any) -> int | None:
        """Tokens the engine served for the call of grant ``ticket_id`` (the gateway asks when its client left
        before the reply): see :class:`replicas.call_outcomes.CallOutcomes`. ``granted_replica`` routes this
        call to the replica the grant names; ``later``, as in :meth:`generate`."""
        return await self.outcomes.served(ticket_id, timeout_s)

    async def _stream_cut(self, key: str) -> None:
        """A stream its caller cut, before the cancel reaches the engine: what the engine served for it (the
        tokens of lines the reply had not read yet included, which are charged). A subclass that can also
        abort the engine request here does, so that nothing more is served past this count."""
        self._engine_at_cut[key] = self.engine_served().get(key)

    def cut_short(self, key: str, served: int | None) -> None:
        """Request ``key`` was cancelled having served ``served`` tokens (the engine's count, if known)."""
        self._served_when_cut[key] = served

    async def _holds_grant(self, ticket_id: str | None) -> bool:
        return ticket_id is not None and self._registration is not None and await self._registration.holds_grant(ticket_id)

    def serve(self, endpoint: Endpoint, body: dict[str, Any]) -> AsyncIterator[dict[str, Any] | str]:
        """The engine's reply to one request (run under ``body["request_id"]``), in ``generate``'s format."""
        raise NotImplementedError

    def _leave_fleet(self) -> Awaitable[None] | None:
        """Stop reporting and renewing, once. With an event loop running (Serve's graceful stop calls
        ``__del__`` there and awaits what it returns) also the coroutine that deregisters at once, so the
        queue grants nothing more here; otherwise the lease lapses."""
        if self._left:
            return None
        self._left = True
        if self._reporter is not None:
            self._reporter.stop()
        if self._registration is None:
            return None
        self._registration.stop()
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # garbage collection, no loop: the lease lapses
            return None
        return self._registration.deregister()


def _served_in(header: dict[str, Any]) -> int | None:
    """Tokens a reply's header says were served: a full reply's usage, an error's ``served`` (0 when it has
    none), None for a stream."""
    if header.get("stream"):
        return None
    if header.get("status") != 200:
        return int(header.get("served") or 0)
    total = ((header.get("body") or {}).get("usage") or {}).get("total_tokens")
    return None if total is None else int(total)


def _no_grant() -> dict[str, Any]:
    return {"error": {"message": "This replica serves only requests the global queue granted to it.",
                      "type": "permission_error", "param": None, "code": "no_grant"}}


def serve_replica_id() -> str:
    """This Serve replica's unique id (what grants name), or a local one outside Serve."""
    from ray import serve

    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside a Serve replica (local testing mode)
        return f"local-{uuid.uuid4().hex[:8]}"
