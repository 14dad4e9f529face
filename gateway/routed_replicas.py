"""What this gateway process's grant routers have seen: the replicas they delivered grants to, and the
replicas they list now.

This state lives apart from :mod:`gateway.routing` on purpose. Ray Serve pickles a deployment's request
router class *by value*, module globals included (``cloudpickle.register_pickle_by_value`` on the router's
module, ``RequestRouterConfig``), so the router that runs in this process holds its own copy of
``gateway.routing``'s globals, which the rest of the gateway never sees. A module the router only imports is
pickled by reference: this one is the process's own, shared by the routers and the admission code.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

ROUTED_KEPT = 4096  # replica ids remembered per gateway process (oldest forgotten first)
_routed: OrderedDict[str, None] = OrderedDict()  # replicas this process's routers have delivered grants to
_routers: weakref.WeakSet[Any] = weakref.WeakSet()  # this process's routers that delivered a grant


def remember(replica_id: str, router: Any) -> None:
    """``router`` (a Ray Serve ``RequestRouter``) delivered a grant to ``replica_id``."""
    _routed[replica_id] = None
    _routed.move_to_end(replica_id)
    if len(_routed) > ROUTED_KEPT:
        _routed.popitem(last=False)
    _routers.add(router)


def was_routed(replica_id: str) -> bool:
    """True when a router of this process has delivered a grant to ``replica_id``: a granted replica that is
    no longer among the candidates is then leaving (Serve is draining or has stopped it), not merely new to
    this router (a replica that registered before Serve published it)."""
    return replica_id in _routed


def is_routable(replica_id: str) -> bool:
    """True when a router of this process lists ``replica_id`` among its replicas now: Serve runs it and routes
    to it. A replica Serve is draining, or has stopped, is listed by none. (Serve may update a router's list
    from another thread; it replaces the list whole, and a list that changes while read here counts as
    routable.)"""
    try:
        return any(replica.unique_id == replica_id
                   for router in list(_routers) for replica in list(router.curr_replicas))
    except RuntimeError:
        return True
