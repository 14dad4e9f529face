"""A replica Serve is draining stays held out of the queue while this process's routers no longer list it."""

from __future__ import annotations

import asyncio

import redis

from gateway.leaving_replicas import LeavingReplicas


class Fleet:
    """What the keeper sees: which replicas the routers list, the holds it renews, a clock that sleeps move."""

    def __init__(self) -> None:
        self.now = 0.0
        self.routable: set[str] = set()
        self.holds: list[tuple[float, str, int]] = []
        self.fail = False

    async def hold(self, replica_id: str, hold_ms: int) -> None:
        if self.fail:
            raise redis.ConnectionError("down")
        self.holds.append((self.now, replica_id, hold_ms))

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)

    def keeper(self, max_s: float = 300.0, hold_s: float = 10.0) -> LeavingReplicas:
        return LeavingReplicas(self.hold, lambda replica: replica in self.routable, hold_s, max_s,
                               sleep=self.sleep, clock=lambda: self.now)


async def settle(rounds: int = 200) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def test_a_draining_replica_is_held_out_every_half_hold_until_the_longest_drain_ends() -> None:
    fleet = Fleet()
    fleet.keeper(max_s=60.0).watch("r1")
    await settle()
    assert [at for at, _, _ in fleet.holds] == [5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0, 55.0]
    assert {(replica, ms) for _, replica, ms in fleet.holds} == {("r1", 10_000)}  # the hold never lapses


async def test_a_replica_the_routers_list_again_is_let_back() -> None:
    fleet = Fleet()
    keeper = fleet.keeper()
    keeper.watch("r1")
    await settle(20)
    renewed = len(fleet.holds)
    assert renewed > 0
    fleet.routable.add("r1")
    await settle()
    assert len(fleet.holds) <= renewed + 1
    keeper.watch("r1")  # its keeper has ended: a later hold starts a new one
    await settle(5)
    assert len(fleet.holds) <= renewed + 1


async def test_one_keeper_a_replica_and_none_without_a_hold() -> None:
    fleet = Fleet()
    keeper = fleet.keeper(max_s=20.0)
    keeper.watch("r1")
    keeper.watch("r1")
    await settle()
    assert len(fleet.holds) == 3  # 5, 10, 15 s: one keeper, not two
    unheld = Fleet()
    unheld.keeper(hold_s=0).watch("r1")
    await settle()
    assert unheld.holds == []


async def test_a_redis_error_ends_the_renewals() -> None:
    fleet = Fleet()
    fleet.fail = True
    keeper = fleet.keeper()
    keeper.watch("r1")
    await settle()
    fleet.fail = False
    await settle()
    assert fleet.holds == []  # its hold runs out; the next requeue holds it again
