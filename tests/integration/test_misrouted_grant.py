"""A grant whose replica the gateway's router cannot reach (Serve is draining it): the gateway's place
requeues the ticket, which is granted to another replica, and holds the unreachable one out of the fleet,
so its heartbeat (which goes on while it drains) does not bring it back for ``unreachable_hold_s``. Real
Redis, the gateway's own admission and the replicas' own registration calls."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest

from fleet.config import QueueConfig
from gateway.admission import AdmissionRequest, QueueAdmission
from gateway.metrics import GatewayMetrics
from policies.types import ReplicaCapacity

pytestmark = pytest.mark.integration


def _request() -> AdmissionRequest:
    tenant = SimpleNamespace(id="acme", weight=1.0, rate_limits=None, max_band=None)
    size = SimpleNamespace(cost=40, length_class="short", prompt_tokens=8)
    asked = SimpleNamespace(flow="", ttft_slo_s=None)
    return AdmissionRequest(parsed=None, tenant=tenant, decision=SimpleNamespace(band="standard"), asked=asked,
                            size=size, arrived=0.0)


async def test_a_misrouted_grant_goes_elsewhere_and_its_replica_stays_out(redis_url: str) -> None:
    config = QueueConfig(redis_url=redis_url, namespace=f"mr{uuid.uuid4().hex[:10]}", unreachable_hold_s=60)
    admission = QueueAdmission(config, GatewayMetrics())
    queue = (await admission.session()).queue
    replicas = {name: ReplicaCapacity(name, 4, 10_000, accepts=frozenset({"short", "long"})) for name in ("a", "b")}
    for capacity in replicas.values():
        await queue.register_replica(capacity, lease_ms=60_000)

    place = await admission.admit(_request())
    draining = place.replica_id
    await place.requeue()  # what the gateway does when another replica answered MISROUTED for it
    assert place.replica_id not in (None, draining)

    await queue.register_replica(replicas[draining], lease_ms=60_000)  # its heartbeat, while it drains
    snapshot = await queue.snapshot()
    assert [r.replica_id for r in snapshot.replicas] == [place.replica_id]
    assert snapshot.stats["replicas_held_out"] == 1
    second = await admission.admit(_request())
    assert second.replica_id == place.replica_id
    for granted in (place, second):
        await granted.release(8)
