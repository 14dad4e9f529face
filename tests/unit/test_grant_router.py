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


async def test_a_replica_is_remembered_once_a_grant_was_delivered_to_it() -> None:
    from gateway.routing import ROUTED_KEPT, was_routed

    assert not was_routed("d")
    await _choose(_FakeRequest({GRANT_KWARG: "zz"}))  # not a candidate: nothing delivered, nothing learned
    assert not was_routed("zz")
    await _choose(_FakeRequest({GRANT_KWARG: "c"}))
    assert was_routed("c")
    for index in range(ROUTED_KEPT):  # bounded: the oldest is forgotten first
        await GrantRouter.choose_replicas(object.__new__(GrantRouter), [_FakeReplica(_ReplicaId(f"n{index}"))],
                                          _FakeRequest({GRANT_KWARG: f"n{index}"}))
    assert not was_routed("c") and was_routed(f"n{ROUTED_KEPT - 1}")
