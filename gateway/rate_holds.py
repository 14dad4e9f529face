"""Rate-limited tenants refused before their bodies are read.

The tenants' rate limits live in the global queue, taken in the enqueue step, so a request is refused there
only after the gateway has read, parsed and counted it: a tenant past its limit could still make every
gateway parse megabytes per request. When the queue refuses a request and says no request of that tenant can
pass for a while (its request bucket is empty, or its token bucket holds no token), this gateway remembers
it and answers the tenant's next requests 429 at once, from the headers, until then. It never refuses what the
queue would admit: the buckets only refill, so a tenant the queue holds back stays held back until the time
the queue named.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from gateway.errors import RateLimited

KEPT_TENANTS = 4096  # tenants remembered (the oldest hold forgotten first: it only costs a parse)


class RateHolds:
    """Until when each recently refused tenant can have no request admitted."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()

    def hold(self, tenant: str, seconds: float) -> None:
        """The queue said no request of ``tenant`` can pass for ``seconds``."""
        if seconds <= 0:
            return
        self._until[tenant] = self._clock() + seconds
        self._until.move_to_end(tenant)
        while len(self._until) > KEPT_TENANTS:
            self._until.popitem(last=False)

    def check(self, tenant: str) -> None:
        """Raise the 429 for ``tenant`` while it is held."""
        until = self._until.get(tenant)
        if until is None:
            return
        left = until - self._clock()
        if left <= 0:
            del self._until[tenant]
            return
        raise RateLimited.after(left)
