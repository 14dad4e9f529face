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
    from gateway.routed_replicas import ROUTED_KEPT, was_routed

    assert not was_routed("d")
    await _choose(_FakeRequest({GRANT_KWARG: "zz"}))  # not a candidate: nothing delivered, nothing learned
    assert not was_routed("zz")
    await _choose(_FakeRequest({GRANT_KWARG: "c"}))
    assert was_routed("c")
    for index in range(ROUTED_KEPT):  # bounded: the oldest is forgotten first
        await GrantRouter.choose_replicas(object.__new__(GrantRouter), [_FakeReplica(_ReplicaId(f"n{index}"))],
                                          _FakeRequest({GRANT_KWARG: f"n{index}"}))
    assert not was_routed("c") and was_routed(f"n{ROUTED_KEPT - 1}")


async def test_a_replica_is_routable_while_a_router_that_delivered_a_grant_lists_it() -> None:
    from gateway.routed_replicas import is_routable

    router = object.__new__(GrantRouter)
    router._replicas = {replica.replica_id: replica for replica in REPLICAS}  # what Serve last told the router
    assert not is_routable("b")  # this router has delivered nothing yet
    await router.choose_replicas(REPLICAS, _FakeRequest({GRANT_KWARG: "a"}))
    assert is_routable("b") and not is_routable("zz")
    router._replicas = {replica.replica_id: replica for replica in REPLICAS if replica.replica_id.unique_id != "b"}
    assert not is_routable("b")  # Serve is draining it (Serve replaces the list whole)


SHIPPED_ROUTER_RUN = """
import asyncio, pickle, sys
from types import SimpleNamespace
from gateway.routed_replicas import is_routable, was_routed
shipped = pickle.loads(open(sys.argv[1], "rb").read())
class Id:  # hashable, as Serve's ReplicaID
    def __init__(self, unique_id): self.unique_id = unique_id
replicas = [SimpleNamespace(replica_id=Id(name)) for name in ("a", "b")]
router = object.__new__(shipped)
router._replicas = {replica.replica_id: replica for replica in replicas}
chosen = asyncio.run(router.choose_replicas(replicas, SimpleNamespace(kwargs={"granted_replica": "a"})))
print(chosen == [[replicas[0]]], was_routed("a"), is_routable("b"), is_routable("c"))
"""


def test_the_router_serve_ships_shares_what_it_saw_with_the_gateway(tmp_path) -> None:
    """Ray Serve ships a request router class pickled by value, module globals included (RequestRouterConfig),
    and unpickles it in the gateway's process: what that copy remembers must reach the gateway's own modules,
    or no departing replica is ever held out."""
    import subprocess
    import sys
    from pathlib import Path

    import cloudpickle

    import gateway.routing

    cloudpickle.register_pickle_by_value(gateway.routing)  # as RequestRouterConfig does
    try:
        (tmp_path / "router.pkl").write_bytes(cloudpickle.dumps(GrantRouter))
    finally:
        cloudpickle.unregister_pickle_by_value(gateway.routing)
    run = subprocess.run([sys.executable, "-c", SHIPPED_ROUTER_RUN, str(tmp_path / "router.pkl")], check=True,
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert run.stdout.split() == ["True", "True", "True", "False"], run.stdout + run.stderr
