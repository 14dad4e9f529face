"""Band order: which band's tickets go first. Mirrored by ``fleet/lua/band_order.lua``.

Bands are strict, highest first: a lower band gets a grant only when no ticket of a higher band can be
placed (work-conserving strict priority). Aging is the starvation guard: a ticket that has waited its
band's ``aging_ms`` moves to the tail of its tenant's queue in the band above (and may move again), but
never above its tenant's ceiling: there it stays, and ages no further.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.types import BandPolicy


def bands_in_order(bands: Sequence[BandPolicy]) -> Sequence[BandPolicy]:
    """The bands in the order dispatch tries them (as configured: highest first)."""
    return bands


def may_age_into(bands: Sequence[BandPolicy], index: int, ceiling: str) -> bool:
    """True when a ticket whose ceiling is ``ceiling`` ("": none) may be lifted into ``bands[index]``."""
    return not ceiling or index >= next(i for i, band in enumerate(bands) if band.name == ceiling)


def aging_cutoff(bands: Sequence[BandPolicy], index: int, now_ms: int) -> int | None:
    """Tickets of ``bands[index]`` that entered it at or before this time move up one band; None: none do."""
    if index < 1 or bands[index].aging_ms <= 0:
        return None
    return now_ms - bands[index].aging_ms
