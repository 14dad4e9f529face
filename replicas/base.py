"""What every replica deployment shares: its reply format, the misroute check, and joining the fleet.

The gateway calls :meth:`ReplicaBase.generate` with a plain request body and the replica its grant names;
the first message of every reply is a :class:`ReplicaReply` header, then (for streams) the SSE lines.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel

from fleet.capacity import CapacityRegistration
from policies.types import ReplicaCapacity
from replicas.spec import ReplicaSpec

Endpoint = Literal["chat", "completion"]
MISROUTED = 421  # "misdirected request": the call reached a replica other than the granted one


class ReplicaReply(BaseModel):
    """First message of every reply: the HTTP status, and either the full JSON body or ``stream=True``."""

    status: int
    body: dict[str, Any] | None = None
    stream: bool = False


class ReplicaBase:
    """A Ray Serve replica that serves one engine; subclasses implement :meth:`serve`, ``models`` and
    ``check_health``."""

    spec: ReplicaSpec
    replica_id: str
    _registration: CapacityRegistration | None = None

    def _adopt(self, spec: ReplicaSpec) -> None:
        self.spec = spec
        self.replica_id = serve_replica_id()

    async def _join_fleet(self, slots: int, kv_tokens: int, publish_metrics: bool) -> ReplicaCapacity:
        """Register this replica's capacity with the global queue (when there is one) and keep it alive."""
        capacity = ReplicaCapacity(replica_id=self.replica_id, slots_total=slots, tokens_total=kv_tokens,
                                   accepts=frozenset(self.spec.accepts), prefers=frozenset(self.spec.prefers),
                                   pool=self.spec.pool)
        if self.spec.queue is not None:
            self._registration = CapacityRegistration(self.spec.queue, capacity)
            await self._registration.start()
            if publish_metrics:
                self._registration.publish_metrics(self.spec.metrics_interval_s)
        return capacity

    async def generate(
        self, endpoint: Endpoint, body: dict[str, Any], granted_replica: str | None = None
    ) -> AsyncIterator[dict[str, Any] | str]:
        """Run one request; yield a ReplicaReply dict, then SSE lines if the reply streams.

        ``granted_replica`` is the replica the global queue granted the request to; a call that reaches
        another replica (the granted one is gone) is answered MISROUTED at once, and the gateway requeues.
        """
        if granted_replica is not None and granted_replica != self.replica_id:
            yield ReplicaReply(status=MISROUTED).model_dump()
            return
        async for message in self.serve(endpoint, body):
            yield message

    def serve(self, endpoint: Endpoint, body: dict[str, Any]) -> AsyncIterator[dict[str, Any] | str]:
        """The engine's reply to one request, in ``generate``'s format."""
        raise NotImplementedError

    def _leave_fleet(self) -> None:
        if self._registration is not None:
            self._registration.stop()


def serve_replica_id() -> str:
    """This Serve replica's unique id (what grants name), or a local one outside Serve."""
    from ray import serve

    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside a Serve replica (local testing mode)
        return f"local-{uuid.uuid4().hex[:8]}"
