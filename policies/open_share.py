"""Who may open one more request on a crowded gateway replica: no tenant beyond an even split of it.

Ray Serve sends a gateway replica at most ``max_ongoing_requests`` requests at once and keeps the rest in its
own queue, first come first served, before the gateway knows their tenant, band or weight. A request waiting
in the global queue holds its slot, so one tenant's flood could fill every slot and every other tenant would
wait behind it there (measured: 33.8 s for one request behind another tenant's 300, at 100 slots).

Below ``crowded`` open requests anyone may open more. From there on, a tenant may hold at most an even split
of ``crowded`` among the tenants with open requests (itself counted). So a tenant alone stops at ``crowded``,
and the slots above it stay free for the next tenant to arrive; that tenant is admitted at once (it holds
none), and while the flood's requests end, the flood's next ones are refused until each tenant holds its
split. Several tenants flooding at once can still fill the slots above ``crowded`` between them; per-tenant
rate limits bound that.
"""

from __future__ import annotations


def crowded_at(slots: int, crowded_share: float) -> int:
    """Open requests from which the even split applies: ``crowded_share`` of ``slots``, at least one."""
    return max(1, int(slots * crowded_share))


def may_open(held: int, open_total: int, tenants_open: int, crowded: int) -> bool:
    """Whether a tenant holding ``held`` of the ``open_total`` requests open on a gateway replica (held by
    ``tenants_open`` tenants) may open one more, when the replica counts as crowded from ``crowded``."""
    if open_total < crowded:
        return True
    tenants = tenants_open + (1 if held == 0 else 0)
    return held < max(1, crowded // max(1, tenants))
