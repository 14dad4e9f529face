"""The deployment across two Ray nodes: a head and a second node started with `ray start` on this machine.

Each vLLM pool is pinned to one node by a custom resource (`pools[].resources`), the gateways run wherever
Ray puts them, and the end-to-end path still holds: long prompts on the throughput pool (second node),
short ones on the latency pool (head node), the ledger balanced afterwards. This is the path a
multi-node cluster (KubeRay) takes. Slow: `-m multinode`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.local_redis import running_redis
from tests.conftest import REPO_ROOT, TINY_MODEL_NAME
from tests.support.ports import free_port
from tests.support.serve_launcher import serve_run
from tests.ledger import assert_ledger_balanced, snapshot

pytestmark = pytest.mark.multinode


def _ray(*args: str) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run(["ray", *args], check=True, env=env, capture_output=True, timeout=180)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A two-node Ray cluster on this machine; yields the head's address."""
    address = f"127.0.0.1:{free_port()}"
    _ray("start", "--head", f"--port={address.split(':')[1]}", "--num-cpus=1", "--include-dashboard=false",
         "--resources", json.dumps({"head_node": 1}))
    try:
        _ray("start", f"--address={address}", "--num-cpus=1", "--resources", json.dumps({"second_node": 1}))
        yield address
    finally:  # gracefully first: replicas shut their vLLM engines down (a forced stop would orphan them)
        _ray("stop", "--grace-period", "60")
        _ray("stop", "--force")


@pytest.fixture(scope="module")
def base_url(cluster: str, tiny_model_path: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The deployment on the two-node cluster: (its URL, its Redis URL)."""
    work_dir = tmp_path_factory.mktemp("multinode")

    def on_two_nodes(args: dict, redis_url: str) -> None:
        # on a cluster started apart (as with KubeRay), Serve builds the application on a cluster node: the
        # shell's REDIS_URL does not reach it, so the URL goes in the config (or the nodes' environment)
        args["queue"]["redis_url"] = redis_url
        args["gateway"]["num_replicas"] = 2
        args["access"] = {"allow_anonymous": True}
        for pool in args["pools"]:
            pool["resources"] = {"head_node" if pool["name"] == "latency" else "second_node": 0.1}

    with running_redis(work_dir) as redis_url:

        def ready() -> bool:
            return len(snapshot(redis_url).replicas) == 2

        env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
        with serve_run(REPO_ROOT / "deploy" / "local.yaml", work_dir, ready=ready,
                       edit=lambda args: on_two_nodes(args, redis_url), env={**env, "RAY_ADDRESS": cluster}) as url:
            yield url, redis_url


def _alive_nodes(address: str) -> list[dict[str, float]]:
    """The custom resources of each alive node (asked from a separate driver process)."""
    code = ("import json, ray; ray.init(address=%r, log_to_driver=False); "
            "print(json.dumps([{k: v for k, v in n['Resources'].items() if k.endswith('_node')} "
            "for n in ray.nodes() if n['Alive']]))" % address)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run(["python", "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    return sorted(json.loads(out.stdout.strip().splitlines()[-1]), key=lambda r: sorted(r))


def test_pools_on_two_nodes_serve_end_to_end(cluster: str, base_url: tuple[str, str]) -> None:
    url, redis_url = base_url
    assert _alive_nodes(cluster) == [{"head_node": 1.0}, {"second_node": 1.0}]
    for prompt, pool in (("a short one", "latency"), ("the fleet gateway " * 300, "throughput")):
        response = httpx.post(f"{url}/v1/completions", timeout=120,
                              json={"model": TINY_MODEL_NAME, "prompt": prompt, "max_tokens": 4})
        assert response.status_code == 200, response.text
        assert response.headers["x-fleetgate-pool"] == pool
    stream = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": TINY_MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True})
    assert stream.text.rstrip().endswith("data: [DONE]")
    assert_ledger_balanced(redis_url, 2)
