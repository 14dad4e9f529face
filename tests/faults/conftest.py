"""A `serve run deploy/local.yaml` deployment of its own for the fault tests, which kill parts of it.

Short leases (5 s) so a dead holder's capacity comes back quickly; its own Redis on a fixed port so a
test can stop and restart it; anonymous access (the fault tests are not about keys). A test module may size
its gateways with ``GATEWAY_MAX_ONGOING_REQUESTS``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from fleet.keys import QueueKeys
from tests.support.local_redis import RedisProcess
from tests.support.processes import kill, replica_pids  # noqa: F401 - the fault tests use them
from tests.conftest import REPO_ROOT
from tests.support.serve_launcher import serve_run
from tests.ledger import snapshot

GATEWAYS = 2
REPLICAS = 2
SLOTS = 4
LEASE_S = 5


@dataclass
class Fleet:
    """The running deployment under test."""

    url: str
    redis: RedisProcess
    work_dir: Path  # the deployed config's copy and serve run's log

    config_file = REPO_ROOT / "deploy" / "local.yaml"

    @property
    def redis_url(self) -> str:
        return self.redis.url


def wait_for(condition, timeout_s: float, what: str, period_s: float = 0.2):
    """Poll ``condition`` until it returns something truthy (bounded); return that."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(period_s)
    return result


@functools.cache
def _client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, socket_timeout=30, socket_connect_timeout=5)


def gateways_publishing(redis_url: str) -> set[str]:
    """The gateway replicas whose metrics are live (each publishes every second)."""
    client = _client(redis_url)
    keys = QueueKeys(namespace="local")
    return {s.decode() for s in client.smembers(keys.metrics_sources())
            if s.startswith(b"gateway:") and client.exists(keys.metrics(s.decode()))}


@pytest.fixture(scope="module")
def fleet(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> Iterator[Fleet]:
    work_dir = tmp_path_factory.mktemp("faults")
    gateway_slots = getattr(request.module, "GATEWAY_MAX_ONGOING_REQUESTS", None)
    server = RedisProcess(work_dir)
    server.start()

    def for_faults(args: dict) -> None:
        args["gateway"]["num_replicas"] = GATEWAYS
        if gateway_slots is not None:
            args["gateway"]["max_ongoing_requests"] = gateway_slots
        for pool in args["pools"]:
            pool["engine"]["max_num_seqs"] = SLOTS
        args["queue"].update({"lease_s": LEASE_S, "max_wait_s": 30})
        args["access"] = {"allow_anonymous": True, "trust_tenant_header": True}
        args["metrics"] = {"publish_interval_s": 1.0}

    def ready() -> bool:
        return (len(snapshot(server.url).replicas) == REPLICAS
                and len(gateways_publishing(server.url)) == GATEWAYS)

    try:
        with serve_run(REPO_ROOT / "deploy" / "local.yaml", work_dir, env={"REDIS_URL": server.url},
                       edit=for_faults, ready=ready) as url:
            yield Fleet(url, server, work_dir)
    finally:
        server.stop()
