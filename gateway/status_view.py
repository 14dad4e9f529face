"""The text of ``fleetgate status``: bands, tenants, replicas and gateways from one queue snapshot."""

from __future__ import annotations

import datetime
from typing import Any

from fleet.snapshot import QueueSnapshot


def render_status(snapshot: QueueSnapshot, namespace: str, redis_url: str, sources: list[str]) -> str:
    """A plain-text view of the global queue (one consistent snapshot)."""
    now = datetime.datetime.fromtimestamp(snapshot.now_ms / 1000, datetime.UTC)
    lines = [f"fleetgate status  namespace={namespace}  redis={redis_url}  {now:%Y-%m-%d %H:%M:%S} UTC", ""]
    lines += _table(
        ["BAND", "QUEUED", "QUEUED TOKENS", "WAITING TENANTS"],
        [[band.name, band.queued, band.queued_tokens, len(band.tenants)] for band in snapshot.bands],
    )
    tenant_rows = []
    for band in snapshot.bands:
        for tenant, waiting in sorted(band.tenants.items()):
            tenant_rows.append([tenant, band.name, waiting.queued, waiting.queued_tokens,
                                f"{band.counters.get(tenant, 0):.0f}"])
    lines += [""] + (_table(["TENANT", "BAND", "QUEUED", "QUEUED TOKENS", "VTC"], tenant_rows)
                     if tenant_rows else ["no tenant is waiting"])
    replica_rows = []
    for replica in snapshot.replicas:
        used = replica.slots_total - replica.slots_free
        reserved = replica.tokens_total - replica.tokens_free
        lease_s = (replica.expires_ms - snapshot.now_ms) / 1000
        replica_rows.append([replica.replica_id, replica.pool, f"{used}/{replica.slots_total}",
                             f"{reserved}/{replica.tokens_total}", ",".join(replica.accepts),
                             ",".join(replica.prefers) or "-", f"{lease_s:.1f}s"])
    lines += [""] + (_table(["REPLICA", "POOL", "SLOTS USED", "KV TOKENS RESERVED", "ACCEPTS", "PREFERS", "LEASE"],
                            replica_rows) if replica_rows else ["no replica registered"])
    gateways = [s.split(":", 1)[1] for s in sources if s.startswith("gateway:")]
    lines += ["", f"gateways publishing: {len(gateways)}" + (f" ({', '.join(gateways)})" if gateways else "")]
    lines.append(f"tickets: {snapshot.tickets}  " +
                 "  ".join(f"{name}={count}" for name, count in sorted(snapshot.stats.items())))
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [header] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]

