"""The ``x-fleetgate-*`` response headers: how a request was classified, queued and placed (one place)."""

from __future__ import annotations

from gateway.classify import Classification
from policies.priority import BandDecision


def classification_headers(decision: BandDecision, size: Classification, pool: str, queue_ms: float | None,
                           gateway_id: str) -> dict[str, str]:
    """Headers of a successful reply; the band-capped pair only when the band was lowered."""
    headers = {
        "x-fleetgate-band": decision.band,
        "x-fleetgate-length-class": size.length_class,
        "x-fleetgate-prompt-tokens": str(size.prompt_tokens),
        "x-fleetgate-pool": pool,
    }
    if queue_ms is not None:
        headers["x-fleetgate-queue-ms"] = f"{queue_ms:.1f}"
    if gateway_id:
        headers["x-fleetgate-gateway"] = gateway_id
    if decision.capped:
        headers |= {"x-fleetgate-band-capped": "true", "x-fleetgate-requested-band": decision.requested}
    return headers
