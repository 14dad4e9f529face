"""A replica whose Redis does not answer yet still starts, and registers once Redis answers: failing its start
instead made Ray Serve give the whole deployment up after three tries (DEPLOY_FAILED, still so once Redis
answered), so a fleet whose Redis came up after its replicas never served."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from redis.exceptions import AuthenticationError

from fleet.capacity import CapacityRegistration
from fleet.config import QueueConfig
from policies.types import ReplicaCapacity
from tests.support.local_redis import RedisProcess

pytestmark = pytest.mark.integration


async def test_a_replica_started_before_its_redis_registers_when_it_answers(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path / "redis")  # not running yet
    config = QueueConfig(redis_url=server.url, namespace="late-redis", lease_s=1.5)
    registration = CapacityRegistration(config, ReplicaCapacity("early", 4, 10_000))
    await asyncio.wait_for(registration.start(), 30)  # returns: the replica starts without its Redis
    try:
        await asyncio.to_thread(server.start)
        deadline = time.monotonic() + 10
        while [r.replica_id for r in (await registration.queue.snapshot()).replicas] != ["early"]:
            assert time.monotonic() < deadline, "the replica never registered once Redis answered"
            await asyncio.sleep(0.1)
    finally:
        registration.stop()
        server.stop()


async def test_a_wrong_password_still_fails_the_start(tmp_path: Path) -> None:
    """The config's mistake, which no wait mends: the start fails, loudly."""
    server = RedisProcess(tmp_path / "redis", password="right")
    await asyncio.to_thread(server.start)
    try:
        config = QueueConfig(redis_url=f"redis://:wrong@127.0.0.1:{server.port}/0", namespace="late-redis")
        with pytest.raises(AuthenticationError):
            await CapacityRegistration(config, ReplicaCapacity("early", 4, 10_000)).start()
    finally:
        server.stop()
