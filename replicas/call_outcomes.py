"""What each granted call to a replica served, kept a little while after it ends.

A client that leaves before its (non-streamed) reply cancels the gateway's call, and Ray Serve cancels the
replica's call with it, so the reply, and the usage in it, never reach the gateway. The gateway then asks the
replica (:meth:`CallOutcomes.served`): the tokens the engine served for that grant, as the engine counted
them, so the tenant is charged what ran, not an estimate.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

KEPT = 1024  # ended calls (and stops of calls not yet arrived) remembered, newest first


class CallOutcomes:
    """Per grant (ticket id): the tokens its call served (a stream's: the engine's latest count, lines held
    for batching included), None where the replica does not know."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._running: dict[str, asyncio.Future[int | None]] = {}
        self._ended: OrderedDict[str, int | None] = OrderedDict()
        self._stopped: OrderedDict[str, None] = OrderedDict()

    def begin(self, ticket_id: str) -> bool:
        """A call for ``ticket_id`` arrived; False if the gateway already gave it up (run nothing)."""
        if ticket_id in self._stopped:
            del self._stopped[ticket_id]
            return False
        self._running[ticket_id] = asyncio.get_running_loop().create_future()
        return True

    def end(self, ticket_id: str, served: int | None) -> None:
        """The call for ``ticket_id`` is over, having served ``served`` tokens."""
        waiting = self._running.pop(ticket_id, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(served)
        _keep(self._ended, ticket_id, served, self._kept)

    async def served(self, ticket_id: str, timeout_s: float) -> int | None:
        """The tokens ``ticket_id``'s call served, once it has ended (waiting up to ``timeout_s``); None if
        unknown or not ended in time. A call that has not arrived yet is given up: it will run nothing (0)."""
        if ticket_id in self._ended:
            return self._ended[ticket_id]
        waiting = self._running.get(ticket_id)
        if waiting is None:
            _keep(self._stopped, ticket_id, None, self._kept)
            return 0
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), timeout_s)
        except TimeoutError:
            return None


def _keep(recent: OrderedDict, key: str, value: int | None, kept: int) -> None:
    recent[key] = value
    recent.move_to_end(key)
    while len(recent) > kept:
        recent.popitem(last=False)
