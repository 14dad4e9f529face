"""A Ray Serve request router that sends a granted request to exactly the replica its grant names.

The global queue decides placement; this router only honours it. The gateway passes the grant's replica id
as the ``granted_replica`` keyword argument of the replica call. If that replica is no longer a candidate
(it died or is draining), any replica takes the call and answers "misrouted" at once, so the gateway puts
the ticket back at the head of its queue instead of waiting on a replica that will never come back.
Calls without a grant (model listing, stats) go to any replica.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from gateway import routed_replicas  # by reference: see its docstring

GRANT_KWARG = "granted_replica"


class GrantRouter(RequestRouter):
    """Routes each granted call to the replica named by its grant."""

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """The granted replica alone when it is a candidate; otherwise every candidate."""
        target = pending_request.kwargs.get(GRANT_KWARG) if pending_request is not None else None
        if target:
            for replica in candidate_replicas:
                if replica.replica_id.unique_id == target:
                    routed_replicas.remember(target, self)
                    return [[replica]]
        return [candidate_replicas]
