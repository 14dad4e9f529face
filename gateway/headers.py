"""The request headers the gateway reads, validated in one place.

| header | meaning |
| --- | --- |
| ``x-priority`` | the band by name |
| ``x-gateway-inference-objective`` | alias (Gateway API Inference Extension / llm-d): an objective name, mapped
  to a band by ``queue.objectives``; ``x-priority`` wins when both are sent |
| ``x-gateway-inference-fairness-id`` | a flow inside the tenant's fair share |
| ``x-slo-ttft-ms`` | queueing deadline: give up (429) if no grant within this many ms |
| ``x-tenant-id`` | anonymous requests only, where ``access.trust_tenant_header`` is on |
| ``x-request-id`` | honoured or generated, and echoed on every response, by Ray Serve's proxy; the gateway
  logs it (:func:`request_id_of`) |
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.errors import InvalidHeader
from gateway.tenants import TENANT_ID_PATTERN

PRIORITY = "x-priority"
OBJECTIVE = "x-gateway-inference-objective"
FAIRNESS_ID = "x-gateway-inference-fairness-id"
TTFT_SLO_MS = "x-slo-ttft-ms"
TENANT_ID = "x-tenant-id"
REQUEST_ID = "x-request-id"

_FLOW = re.compile(r"^[A-Za-z0-9_.:@/=+-]{1,128}$")  # never "|": the queue keys use it as a separator
_TENANT = re.compile(TENANT_ID_PATTERN)
_UNSAFE_IN_LOGS = re.compile(r"[^A-Za-z0-9_.:/=+-]")
MAX_TTFT_SLO_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class RequestHeaders:
    """What the headers ask for; each value is validated, absent ones are None (flow: "")."""

    band: str | None = None
    flow: str = ""
    ttft_slo_s: float | None = None


def read_headers(headers: Mapping[str, str], bands: list[str], objectives: Mapping[str, str]) -> RequestHeaders:
    """Validate the gateway's request headers; an unusable value is a 400 naming the header."""
    return RequestHeaders(
        band=_band(headers, bands, objectives),
        flow=_match(headers, FAIRNESS_ID, _FLOW, "1-128 characters of letters, digits and _.:@/=+-") or "",
        ttft_slo_s=_slo(headers),
    )


def read_tenant_id(headers: Mapping[str, str]) -> str | None:
    """``x-tenant-id`` (trusted only in the local anonymous mode), validated."""
    return _match(headers, TENANT_ID, _TENANT, "a tenant id (letters, digits, _.-; at most 64)")


def _band(headers: Mapping[str, str], bands: list[str], objectives: Mapping[str, str]) -> str | None:
    asked = headers.get(PRIORITY)
    if asked is not None:
        band = asked.strip().lower()  # band names are lowercase (fleet.config.BandConfig): "Batch" is batch
        if band not in bands:
            raise InvalidHeader(f"Unknown {PRIORITY} {asked[:64]!r}; use one of {bands}.", param=PRIORITY)
        return band
    objective = headers.get(OBJECTIVE)
    if objective is None:
        return None
    if objective not in objectives:
        raise InvalidHeader(f"Unknown {OBJECTIVE} {objective!r}; use one of {sorted(objectives)}.", param=OBJECTIVE)
    return objectives[objective]


def _slo(headers: Mapping[str, str]) -> float | None:
    raw = headers.get(TTFT_SLO_MS)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_TTFT_SLO_MS:
        raise InvalidHeader(f"{TTFT_SLO_MS} must be a whole number of milliseconds from 1 to {MAX_TTFT_SLO_MS}.",
                            param=TTFT_SLO_MS)
    return value / 1000


def _match(headers: Mapping[str, str], name: str, pattern: re.Pattern[str], what: str) -> str | None:
    value = headers.get(name)
    if value is None:
        return None
    if not pattern.match(value):
        raise InvalidHeader(f"{name} must be {what}.", param=name)
    return value


def request_id_of(headers: Mapping[str, str]) -> str:
    """The request's id for the logs: the one Serve's proxy set (the client's, or one it generated).

    Characters outside a safe set are replaced and the id is cut at 128, so a client cannot forge log lines.
    """
    raw = headers.get(REQUEST_ID)
    if not raw:
        return uuid.uuid4().hex
    return _UNSAFE_IN_LOGS.sub("?", raw[:128])
