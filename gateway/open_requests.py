"""The requests each tenant holds open on this gateway replica, and the 429 for one over its split when the
replica is crowded (the rule: policies/open_share.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from gateway.errors import TooManyOpenRequests
from policies.open_share import crowded_at, may_open

RETRY_AFTER_S = 1  # a crowded replica frees slots continuously; a second is long enough to wait


class OpenRequests:
    """Counts open requests by tenant for one gateway replica (one event loop: no lock)."""

    def __init__(self, slots: int, crowded_share: float) -> None:
        self._crowded = crowded_at(slots, crowded_share)
        self._held: Counter[str] = Counter()
        self.total = 0

    def open(self, tenant_id: str) -> Callable[[], None]:
        """Count one more request of ``tenant_id``, or raise the 429; returns the call that closes it
        (idempotent, so a path that could close it twice closes it once)."""
        held = self._held[tenant_id]  # a Counter reads a missing key as 0 without adding it
        if not may_open(held, self.total, len(self._held), self._crowded):
            raise TooManyOpenRequests(RETRY_AFTER_S)
        self._held[tenant_id] = held + 1
        self.total += 1
        closed = False

        def close() -> None:
            nonlocal closed
            if closed:
                return
            closed = True
            self.total -= 1
            self._held[tenant_id] -= 1
            if self._held[tenant_id] <= 0:
                del self._held[tenant_id]

        return close

    def held(self, tenant_id: str) -> int:
        """The requests ``tenant_id`` holds open here now."""
        return self._held.get(tenant_id, 0)

    @property
    def tenants(self) -> int:
        """Tenants holding at least one open request here."""
        return len(self._held)
