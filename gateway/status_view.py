"""The text of ``fleetgate status``: bands, tenants, replicas and gateways from one queue snapshot."""

from __future__ import annotations

import datetime
from typing import Any

from fleet.snapshot import QueueSnapshot, ReplicaState
from gateway.http_guard import GUARD_ENV


def render_status(snapshot: QueueSnapshot, namespace: str, redis_url: str, sources: list[str],
                  stale_tenants_file: list[str] | None = None, lua_form: str = "",
                  unguarded: list[str] | None = None, open_requests: dict[str, float] | None = None) -> str:
    """A plain-text view of the global queue (one consistent snapshot); ``stale_tenants_file``: the gateways
    whose tenants file failed to reload (an older one is in force); ``lua_form``: how this Redis runs the
    queue's Lua for this account ("functions" or "scripts", fleet/lua_calls.py); ``unguarded``: the gateways
    on nodes whose Ray started without the header guard (gateway/http_guard.py); ``open_requests``: each
    gateway's requests open now, as it last published them."""
    now = datetime.datetime.fromtimestamp((snapshot.wall_ms or snapshot.now_ms) / 1000, datetime.UTC)
    lua = f"  lua={lua_form}" if lua_form else ""
    lines = [f"fleetgate status  namespace={namespace}  redis={redis_url}{lua}  {now:%Y-%m-%d %H:%M:%S} UTC", ""]
    if snapshot.clock_behind_s >= 1:
        lines += [f"note: the queue's clock runs {snapshot.clock_behind_s:.1f} s behind the wall clock (a wall-clock jump was cut "
                  "so that no lease lapsed: a paused VM or an NTP step); leases and ages are measured on it", ""]
    for gateway in stale_tenants_file or []:
        lines += [f"WARNING: gateway {gateway} could not reload the tenants file; an older one is in force "
                  "(a revoked key may still work). Check it: fleetgate tenants check FILE", ""]
    (guard_name, guard_path), = GUARD_ENV.items()
    for gateway in unguarded or []:
        lines += [f"WARNING: gateway {gateway} runs on a node whose Ray started without the header guard: set "
                  f"{guard_name}={guard_path} where Ray starts (docs/operations.md)", ""]
    lines += _table(
        ["BAND", "QUEUED (HELD)", "QUEUED TOKENS", "WAITING TENANTS", "GATE"],
        [[band.name, band.queued, band.queued_tokens, len(band.tenants),
          f"<{band.max_unstarted_steps:g} steps, kv<{band.kv_ceiling:g}"] for band in snapshot.bands],
    )
    tenant_rows = []
    for band in snapshot.bands:
        for tenant, waiting in sorted(band.tenants.items()):
            tenant_rows.append([tenant, band.name, waiting.queued, waiting.queued_tokens,
                                f"{band.counters.get(tenant, 0):.0f}"])
    lines += [""] + (_table(["TENANT", "BAND", "QUEUED", "QUEUED TOKENS", "VTC"], tenant_rows)
                     if tenant_rows else ["no tenant is waiting"])
    bands = [band.name for band in snapshot.bands]
    replica_rows = [_replica_row(replica, snapshot.now_ms, bands) for replica in snapshot.replicas]
    lines += [""] + (_table(["REPLICA", "POOL", "SLOTS USED", "PENDING/STEP", "UNSTARTED", "RUNNING", "WAITING",
                             "KV", "SIGNALS", "OPEN TO", "ACCEPTS", "PREFERS", "LEASE"], replica_rows)
                     if replica_rows else ["no replica registered"])
    gateways = [s.split(":", 1)[1] for s in sources if s.startswith("gateway:")]
    shown = [g + (f": {open_requests[g]:.0f} requests open" if g in (open_requests or {}) else "") for g in gateways]
    lines += ["", f"gateways publishing: {len(gateways)}" + (f" ({', '.join(shown)})" if gateways else "")]
    lines.append(f"tickets: {snapshot.tickets}  " +
                 "  ".join(f"{name}={count}" for name, count in sorted(snapshot.stats.items())))
    return "\n".join(lines)


def _replica_row(replica: ReplicaState, now_ms: int, bands: list[str]) -> list[Any]:
    """One replica: its capacity, its engine's last report, and which bands the gate lets onto it."""
    lease_s = (replica.expires_ms - now_ms) / 1000
    if replica.fresh:
        signals = f"{(now_ms - replica.signals_at_ms) / 1000:.1f}s ago"
    else:
        signals = "stale (slot cap)" if replica.signals_at_ms else "none (slot cap)"
    opened = replica.open_bands
    open_to = "all" if opened == bands else ("none: gated" if not opened else ",".join(opened))
    slots = f"{replica.slots_total - replica.slots_free}/{replica.slots_total}"
    if replica.guarded_held:
        slots += f" ({replica.guarded_held} guarded)"
    return [replica.replica_id, replica.pool, slots,
            f"{replica.pending}/{replica.step_tokens}", f"{replica.unstarted}+{replica.in_flight} in flight",
            replica.running, replica.waiting, f"{replica.kv_usage:.2f}", signals, open_to,
            ",".join(replica.accepts), _preference(replica), f"{lease_s:.1f}s"]


def _preference(replica: ReplicaState) -> str:
    """The classes its pool is built for, and the reserve its pool keeps free of the others."""
    prefers = ",".join(replica.prefers) or "-"
    return f"{prefers} (reserve {replica.reserve})" if replica.reserve else prefers


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [header] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
