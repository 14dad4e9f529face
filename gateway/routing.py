"""A Ray Serve request router that sends a granted request to exactly the replica its grant names.

The global queue decides placement; this router only honours it. The gateway passes the grant's replica id
as the ``granted_replica`` keyword argument of the replica call. If that replica is no longer a candidate
(it died or is draining), any replica takes the call and answers "misrouted" at once, so the gateway puts
the ticket back at the head of its queue instead of waiting on a replica that will never come back.
Calls without a grant (model listing, stats) go to any replica.
"""

from __future__ import annotations

from collections import OrderedDict

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

GRANT_KWARG = "granted_replica"
ROUTED_KEPT = 4096  # replica ids remembered per gateway process (oldest forgotten first)
_routed: OrderedDict[str, None] = OrderedDict()  # replicas this process's routers have delivered grants to


def was_routed(replica_id: str) -> bool:
    """True when a router of this process has delivered a grant to ``replica_id``: a granted replica that is
    no longer among the candidates is then leaving (Serve is draining or has stopped it), not merely new to
    this router (a replica that registered before Serve published it)."""
    return replica_id in _routed


def _remember(replica_id: str) -> None:
    _routed[replica_id] = None
    _routed.move_to_end(replica_id)
    if len(_routed) > ROUTED_KEPT:
        _routed.popitem(last=False)


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
                    _remember(target)
                    return [[replica]]
        return [candidate_replicas]
