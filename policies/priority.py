"""Which priority band a request runs in: what it asked for, bounded by its tenant's allowance.

Bands are ordered highest first. A tenant may use its ``ceiling`` band and those below it; a request that
asks for more is either capped at the ceiling (the response says so) or refused, as the tenant is
configured. Pure: the gateway turns a refusal into a 403.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

OverAllowance = Literal["cap", "reject"]


class BandNotAllowed(Exception):
    """The request asked for a band above its tenant's allowance, and the tenant is set to refuse."""

    def __init__(self, requested: str, ceiling: str) -> None:
        super().__init__(f"band {requested!r} is above this tenant's allowance {ceiling!r}")
        self.requested = requested
        self.ceiling = ceiling


@dataclass(frozen=True)
class BandDecision:
    """The band a request runs in, and what it asked for (``capped`` when the two differ)."""

    band: str
    requested: str

    @property
    def capped(self) -> bool:
        """True when the request was lowered to its tenant's allowance."""
        return self.band != self.requested


def resolve_band(
    requested: str | None,
    bands: Sequence[str],
    default: str,
    ceiling: str | None = None,
    over_allowance: OverAllowance = "cap",
) -> BandDecision:
    """The band for a request asking for ``requested`` (None: ``default``), at or below ``ceiling``.

    ``requested``, ``default`` and ``ceiling`` must be names in ``bands`` (the caller validates the header).
    """
    wanted = requested or default
    rank = {name: index for index, name in enumerate(bands)}
    if ceiling is None or rank[wanted] >= rank[ceiling]:
        return BandDecision(wanted, wanted)
    if over_allowance == "reject" and requested is not None:
        raise BandNotAllowed(wanted, ceiling)
    return BandDecision(ceiling, wanted)
