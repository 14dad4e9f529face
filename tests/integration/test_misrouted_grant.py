"""A grant whose replica the gateway's router cannot reach: the gateway's place requeues the ticket, which
is granted to another replica. A replica the router delivered to before is leaving (Serve is draining it):
held out of the fleet, so its heartbeat (which goes on while it drains) does not bring it back for
``unreachable_hold_s``. One it never delivered to is new (registered before Serve published it): its next
heartbeat brings it back. Real Redis, the gateway's own admission and router, the replicas' own
registration calls."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest

from fleet.config import QueueConfig
from gateway.admission import AdmissionRequest, QueueAdmission
from gateway.metrics import GatewayMetrics
from gateway.routing import GRANT_KWARG, GrantRouter
from policies.types import ReplicaCapacity

pytestmark = pytest.mark.integration


def _request() -> AdmissionRequest:
    tenant = SimpleNamespace(id="acme", weight=1.0, rate_limits=None, max_band=None)
    size = SimpleNamespace(cost=40, length_class="short", prompt_tokens=8)
    asked = SimpleNamespace(flow="", ttft_slo_s=None)
    return AdmissionRequest(parsed=None, tenant=tenant, decision=SimpleNamespace(band="standard"), asked=asked,
                            size=size, arrived=0.0)


async def _deliver_earlier(replica_id: str) -> None:
    """This gateway's router delivered a grant to ``replica_id`` while Serve still listed it."""
    replica = SimpleNamespace(replica_id=SimpleNamespace(unique_id=replica_id))
    router = object.__new__(GrantRouter)  # choose_replicas needs none of the router's runtime state
    assert await router.choose_replicas([replica], SimpleNamespace(kwargs={GRANT_KWARG: replica_id})) == [[replica]]


async def _fleet(redis_url: str) -> tuple[QueueAdmission, dict[str, ReplicaCapacity]]:
    config = QueueConfig(redis_url=redis_url, namespace=f"mr{uuid.uuid4().hex[:10]}", unreachable_hold_s=60)
    admission = QueueAdmission(config, GatewayMetrics())
    queue = (await admission.session()).queue
    replicas = {name: ReplicaCapacity(name, 4, 10_000, accepts=frozenset({"short", "long"}))
                for name in (f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}")}
    for capacity in replicas.values():
        await queue.register_replica(capacity, lease_ms=60_000)
    return admission, replicas


async def test_a_misrouted_grant_goes_elsewhere_and_a_draining_replica_stays_out(redis_url: str) -> None:
    admission, replicas = await _fleet(redis_url)
    queue = (await admission.session()).queue
    place = await admission.admit(_request())
    draining = place.replica_id
    await _deliver_earlier(draining)
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


async def test_a_replica_the_router_never_reached_comes_back_on_its_next_heartbeat(redis_url: str) -> None:
    admission, replicas = await _fleet(redis_url)
    queue = (await admission.session()).queue
    place = await admission.admit(_request())
    new = place.replica_id  # granted before Serve published it to this gateway's router
    await place.requeue()
    assert place.replica_id not in (None, new)
    await queue.register_replica(replicas[new], lease_ms=60_000)
    snapshot = await queue.snapshot()
    assert {r.replica_id for r in snapshot.replicas} == set(replicas)
    assert "replicas_held_out" not in snapshot.stats
    await place.release(8)
