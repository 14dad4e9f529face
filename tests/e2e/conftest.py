"""One `serve run deploy/local.yaml` deployment shared by every end-to-end test module.

The deployment is the shipped local config with two changes, both for the queue tests: 2 gateway replicas
(fleet-wide ordering across gateways) and 4 sequences per vLLM replica (so a small flood already queues).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gateway.config import QueueConfig
from gateway.queue.factory import queue_settings
from gateway.queue.keys import QueueKeys
from gateway.queue.redis_queue import BlockingGlobalQueue
from tests.conftest import REPO_ROOT
from tests.e2e.deployment import serve_run

SLOTS_PER_REPLICA = 4
GATEWAY_REPLICAS = 2
REPLICAS = 2  # vLLM replicas in deploy/local.yaml


def _for_queue_tests(args: dict) -> None:
    args["gateway"]["num_replicas"] = GATEWAY_REPLICAS
    for pool in args["pools"]:
        pool["engine"]["max_num_seqs"] = SLOTS_PER_REPLICA


@pytest.fixture(scope="session")
def base_url(tiny_model_path: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of the running deployment."""
    config = REPO_ROOT / "deploy" / "local.yaml"
    queue = BlockingGlobalQueue(redis.Redis.from_url(redis_url), QueueKeys(namespace="local"),
                                queue_settings(QueueConfig()))

    def every_replica_registered() -> bool:
        return len(queue.snapshot()["replicas"] or []) == REPLICAS

    with serve_run(config, tmp_path_factory.mktemp("serve"), env={"REDIS_URL": redis_url},
                   edit=_for_queue_tests, ready=every_replica_registered) as url:
        yield url
