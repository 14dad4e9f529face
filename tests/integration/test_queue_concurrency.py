"""Several gateways (own connections, many tasks each) against one real Redis: nothing lost, nothing twice.

Also: a gateway that dies mid-request (stops renewing) loses its leases, and the capacity returns; a
deadline withdraws a waiting ticket; a cancelled waiter leaves no ticket behind.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter

import pytest
import redis
import redis.asyncio as aioredis

from fleet.keys import QueueKeys
from fleet.queue import GlobalQueue, QueueSettings
from fleet.session import QueueDeadlineExpired, QueueSession, QueueTicketLost
from policies.types import BandPolicy, ReplicaCapacity, TicketSpec

pytestmark = pytest.mark.integration

BANDS = (BandPolicy("interactive"), BandPolicy("standard", aging_ms=2000), BandPolicy("batch", aging_ms=4000))
GATEWAYS = 4
TASKS_PER_GATEWAY = 40
REPLICAS = {"replica-a": (3, 2000), "replica-b": (2, 1500)}


def _queue(redis_url: str, namespace: str, lease_ms: int = 15_000) -> GlobalQueue:
    return GlobalQueue(aioredis.Redis.from_url(redis_url), QueueKeys(namespace=namespace),
                            QueueSettings(BANDS, lease_ms=lease_ms))


async def _register(queue: GlobalQueue) -> None:
    for replica_id, (slots, tokens) in REPLICAS.items():
        await queue.register_replica(ReplicaCapacity(replica_id, slots, tokens), lease_ms=600_000)


async def test_many_gateways_every_ticket_ends_exactly_once(redis_url: str) -> None:
    namespace = f"c{uuid.uuid4().hex[:10]}"
    await _register(_queue(redis_url, namespace))
    sessions = [QueueSession(_queue(redis_url, namespace), aioredis.Redis.from_url(redis_url)) for _ in range(GATEWAYS)]
    running = Counter()
    peak = Counter()
    served = []

    async def request(session: QueueSession, index: int) -> tuple[str, str]:
        rng = random.Random(index)
        spec = TicketSpec(session.new_ticket_id(), tenant=f"tenant-{index % 5}", band=rng.choice(BANDS).name,
                          cost=rng.randint(10, 900), weight=1.0 + index % 3, owner=session.owner)
        grant = await session.admit(spec, timeout_s=60)
        running[grant.replica_id] += 1
        peak[grant.replica_id] = max(peak[grant.replica_id], running[grant.replica_id])
        await asyncio.sleep(rng.random() * 0.01)
        running[grant.replica_id] -= 1
        actual = rng.randint(1, spec.cost)
        served.append(actual)
        assert await session.finish(spec.ticket_id, actual)
        assert not await session.finish(spec.ticket_id, actual), "a second finish must be a no-op"
        return spec.ticket_id, grant.replica_id

    results = await asyncio.gather(*(
        request(session, g * TASKS_PER_GATEWAY + i) for g, session in enumerate(sessions) for i in range(TASKS_PER_GATEWAY)
    ))
    for session in sessions:
        await session.close()
    assert len({ticket for ticket, _ in results}) == GATEWAYS * TASKS_PER_GATEWAY
    for replica_id, (slots, _) in REPLICAS.items():
        assert peak[replica_id] <= slots, "a replica never runs more than its slots"
    snapshot = await _queue(redis_url, namespace).snapshot()
    assert snapshot.tickets == 0
    assert snapshot.stats["granted"] == snapshot.stats["completed"] == GATEWAYS * TASKS_PER_GATEWAY
    assert snapshot.stats["served_tokens"] == sum(served)
    for replica in snapshot.replicas:
        assert replica.idle


async def test_dead_gateway_leases_expire_and_capacity_returns(redis_url: str) -> None:
    namespace = f"d{uuid.uuid4().hex[:10]}"
    queue = _queue(redis_url, namespace, lease_ms=1_000)
    await _register(queue)
    dying = QueueSession(queue, aioredis.Redis.from_url(redis_url))
    specs = [TicketSpec(dying.new_ticket_id(), "t", "standard", 100, owner=dying.owner) for _ in range(8)]
    granted = [await queue.enqueue(spec) for spec in specs]  # 5 slots: 5 granted, 3 waiting
    assert sum(len(result.grants) for result in granted) == 5
    # the gateway dies: nothing renews its leases; a sweep one lease later reclaims everything
    later = (await queue.snapshot()).now_ms + 1_001
    await queue.expire(now_ms=later)
    snapshot = await queue.snapshot(now_ms=later)
    assert snapshot.tickets == 0 and snapshot.stats["expired"] == 8
    assert all(band.queued == 0 for band in snapshot.bands)
    for replica in snapshot.replicas:
        assert replica.idle


async def test_deadline_withdraws_the_ticket(redis_url: str) -> None:
    namespace = f"e{uuid.uuid4().hex[:10]}"
    queue = _queue(redis_url, namespace)  # no replica registered: nothing can be granted
    session = QueueSession(queue, aioredis.Redis.from_url(redis_url))
    spec = TicketSpec(session.new_ticket_id(), "t", "batch", 50, owner=session.owner)
    with pytest.raises(QueueDeadlineExpired):
        await session.admit(spec, timeout_s=0.3)
    snapshot = await queue.snapshot()
    assert snapshot.tickets == 0 and snapshot.stats["cancelled"] == 1
    await session.close()


async def test_cancelled_waiter_leaves_nothing_behind(redis_url: str) -> None:
    namespace = f"f{uuid.uuid4().hex[:10]}"
    queue = _queue(redis_url, namespace)
    session = QueueSession(queue, aioredis.Redis.from_url(redis_url))
    spec = TicketSpec(session.new_ticket_id(), "t", "batch", 50, owner=session.owner)
    waiter = asyncio.create_task(session.admit(spec, timeout_s=30))
    while (await queue.snapshot()).tickets == 0:  # the ticket is in Redis, waiting
        await asyncio.sleep(0.01)
    waiter.cancel()  # the client went away while queued
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (await queue.snapshot()).tickets == 0
    assert session.owned == frozenset()
    await session.close()


async def test_a_ticket_the_queue_lost_is_answered_at_once(redis_url: str) -> None:
    namespace = f"g{uuid.uuid4().hex[:10]}"
    queue = _queue(redis_url, namespace, lease_ms=600)  # renewed every 0.2 s
    session = QueueSession(queue, aioredis.Redis.from_url(redis_url))
    spec = TicketSpec(session.new_ticket_id(), "t", "batch", 50, owner=session.owner)
    waiter = asyncio.create_task(session.admit(spec, timeout_s=60))
    while (await queue.snapshot()).tickets == 0:
        await asyncio.sleep(0.01)
    client = redis.Redis.from_url(redis_url)
    client.delete(*client.keys(f"fg:{{{namespace}}}:*"))  # as if Redis restarted empty
    lost_at = asyncio.get_running_loop().time()
    with pytest.raises(QueueTicketLost):
        await waiter
    assert asyncio.get_running_loop().time() - lost_at < 2, "the waiter must not sit out its 60 s deadline"
    await session.close()


async def test_redis_url_with_password(tmp_path) -> None:
    from tests.support.local_redis import running_redis

    with running_redis(tmp_path, password="s3cret-pw") as url:
        queue = _queue(url, "auth")
        await _register(queue)
        result = await queue.enqueue(TicketSpec("one", "t", "interactive", 10))
        assert result.admitted and result.grants[0].replica_id == "replica-a"
        with pytest.raises(redis.exceptions.AuthenticationError):
            await _queue(url.replace(":s3cret-pw@", ":wrong@"), "auth").snapshot()


async def test_redis_over_tls_with_auth(tmp_path) -> None:
    """A `rediss://` URL (TLS, password, the CA in `ssl_ca_certs`) runs the queue as a plain one does."""
    import shutil
    import subprocess
    from pathlib import Path

    from fleet.config import QueueConfig
    from fleet.connection import global_queue, redis_client
    from tests.support.local_redis import redis_server_binary

    with_tls = [b for b in (redis_server_binary(), "/usr/bin/redis-server", "/usr/local/bin/redis-server")
                if Path(b).exists() and "libssl" in subprocess.run(["ldd", b], capture_output=True, text=True).stdout]
    if not with_tls:
        pytest.skip("no redis-server built with TLS here (Debian's is)")
    binary = with_tls[0]
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    from tests.support.ports import free_port

    port = free_port()
    server = subprocess.Popen([binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", "tls-pw",
                               "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                               "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        config = QueueConfig(redis_url=f"rediss://:tls-pw@127.0.0.1:{port}/0?ssl_ca_certs={cert}", namespace="tls")
        queue = global_queue(config, redis_client(config))
        for _ in range(100):  # until the server listens
            try:
                await _register(queue)
                break
            except redis.ConnectionError:
                await asyncio.sleep(0.05)
        result = await queue.enqueue(TicketSpec("over-tls", "t", "interactive", 10))
        assert result.admitted and result.grants[0].replica_id == "replica-a"
        plain = QueueConfig(redis_url=f"redis://:tls-pw@127.0.0.1:{port}/0", namespace="tls")
        with pytest.raises(redis.ConnectionError):
            await global_queue(plain, redis_client(plain)).snapshot()
    finally:
        server.terminate()
        server.wait(timeout=10)


async def test_a_burst_larger_than_the_connection_pool_waits_instead_of_failing(redis_url: str) -> None:
    """1,000 concurrent requests through one gateway's session with 8 Redis connections: every one is
    granted and finished; none fails for want of a connection (redis-py's default pool raises at its cap)."""
    from fleet.config import QueueConfig
    from fleet.connection import global_queue, redis_client

    config = QueueConfig(redis_url=redis_url, namespace=f"b{uuid.uuid4().hex[:10]}", redis_max_connections=8,
                         redis_pool_timeout_s=60)
    queue = global_queue(config, redis_client(config))
    await queue.register_replica(ReplicaCapacity("wide", slots_total=64, tokens_total=10**9), lease_ms=600_000)
    session = QueueSession(queue, redis_client(config, max_connections=2))

    async def request(index: int) -> None:
        spec = TicketSpec(session.new_ticket_id(), tenant=f"tenant-{index % 7}", band="interactive", cost=50,
                          owner=session.owner)
        await session.admit(spec, timeout_s=120)
        assert await session.finish(spec.ticket_id, 40)

    try:
        await asyncio.gather(*(request(i) for i in range(1000)))
        snapshot = await queue.snapshot()
    finally:
        await session.close()
    assert snapshot.stats["granted"] == snapshot.stats["completed"] == 1000
    assert snapshot.tickets == 0 and all(replica.idle for replica in snapshot.replicas)


async def test_the_queue_runs_on_a_redis_cluster(tmp_path) -> None:
    """`queue.redis_cluster`: gateways and replicas on a 3-node Redis Cluster (one namespace, one slot):
    grants, waiting through the inbox, completions and the snapshot work as on one Redis."""
    from fleet.config import QueueConfig
    from fleet.connection import global_queue, redis_client
    from tests.support.local_redis import has_functions, running_redis_cluster

    with running_redis_cluster(tmp_path) as url:
        config = QueueConfig(redis_url=url, redis_cluster=True, namespace="clustered", redis_max_connections=4)
        queue = global_queue(config, redis_client(config))
        await _register(queue)
        sessions = [QueueSession(global_queue(config, redis_client(config)), redis_client(config, max_connections=2))
                    for _ in range(2)]

        async def request(session: QueueSession, index: int) -> None:
            spec = TicketSpec(session.new_ticket_id(), f"tenant-{index % 3}", "standard", 100, owner=session.owner)
            await session.admit(spec, timeout_s=60)
            await asyncio.sleep(0.005)
            assert await session.finish(spec.ticket_id, 90)

        try:
            # 5 slots in all, 60 requests: most wait for a grant pushed to their gateway's inbox
            await asyncio.gather(*(request(sessions[i % 2], i) for i in range(60)))
            snapshot = await queue.snapshot()
        finally:
            for session in sessions:
                await session.close()
        assert snapshot.stats["granted"] == snapshot.stats["completed"] == 60
        assert snapshot.tickets == 0 and all(replica.idle for replica in snapshot.replicas)
        assert queue.lua.form == ("functions" if has_functions(url) else "scripts")  # every shard has the library
