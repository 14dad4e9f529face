"""The grant-honouring router, with fake replicas (no cluster)."""

from dataclasses import dataclass, field

from gateway.routing import GRANT_KWARG, GrantRouter


@dataclass(frozen=True)
class _ReplicaId:
    unique_id: str


@dataclass(frozen=True)
class _FakeReplica:
    replica_id: _ReplicaId


@dataclass
class _FakeRequest:
    kwargs: dict = field(default_factory=dict)


REPLICAS = [_FakeReplica(_ReplicaId("a")), _FakeReplica(_ReplicaId("b")), _FakeReplica(_ReplicaId("c"))]


async def _choose(request):
    router = object.__new__(GrantRouter)  # choose_replicas needs none of the router's runtime state
    return await router.choose_replicas(REPLICAS, request)


async def test_granted_replica_alone() -> None:
    assert await _choose(_FakeRequest({GRANT_KWARG: "b"})) == [[REPLICAS[1]]]


async def test_gone_replica_falls_back_to_any_so_the_call_is_answered_misrouted() -> None:
    assert await _choose(_FakeRequest({GRANT_KWARG: "zz"})) == [REPLICAS]


async def test_calls_without_grant_go_anywhere() -> None:
    assert await _choose(_FakeRequest()) == [REPLICAS]
    assert await _choose(None) == [REPLICAS]
