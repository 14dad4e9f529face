"""One `serve run deploy/local.yaml` deployment shared by every end-to-end test module.

The deployment is the shipped local config, engine settings and gates included, with these changes: 2
gateway replicas (fleet-wide ordering and limits across gateways), 8 Redis connections per gateway (so a
burst waits for them), API keys required (no anonymous access) from a tenants file written for the tests,
per-tenant prefix-cache salts (as deploy/gpu.yaml), and metrics published every second. As
scripts/serve-local.sh does, it runs with Ray Serve's direct ingress (each gateway replica also serves HTTP
on its own port; tests/e2e/test_direct_ingress.py); every other test goes through the Serve proxy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from gateway.cli import main as fleetgate
from fleet.keys import QueueKeys
from gateway.tenants import hash_key
from tests.conftest import REPO_ROOT, TINY_MODEL_NAME
from tests.support.serve_launcher import serve_run
from tests.ledger import snapshot

SHIPPED = yaml.safe_load((REPO_ROOT / "deploy" / "local.yaml").read_text())["applications"][0]["args"]
SLOTS_PER_REPLICA = SHIPPED["pools"][0]["engine"]["max_num_seqs"]  # the shipped engine settings: 32
GATEWAY_REPLICAS = 2
REPLICAS = 2  # vLLM replicas in deploy/local.yaml: one latency, one throughput
RATE_LIMIT_RPM = 20
REDIS_CONNECTIONS = 8  # per gateway process: a burst must wait for them, never fail
SCRAPE_KEY = "fg-scrape-key-for-the-e2e-tests"  # /metrics needs it (metrics.scrape_key_sha256)

TENANTS = f"""
tenants:
  - {{id: flood}}
  - {{id: calm}}
  - {{id: acme, max_band: standard, models: [{TINY_MODEL_NAME}]}}
  - {{id: strict, max_band: batch, over_allowance: reject}}
  - {{id: elsewhere, models: [another-model]}}
  - {{id: limited, rate_limits: {{requests_per_minute: {RATE_LIMIT_RPM}}}}}
"""


@pytest.fixture(scope="session")
def tenants_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' tenants file (the deployment reloads it when a test adds a key)."""
    path = tmp_path_factory.mktemp("tenants") / "tenants.yaml"
    path.write_text(TENANTS)
    return path


@pytest.fixture(scope="session")
def api_keys(tenants_file: Path) -> dict[str, str]:
    """One API key per tenant of the tests' file, made with `fleetgate tenants add-key`."""
    return {tenant: add_key(tenants_file, tenant) for tenant in
            ("flood", "calm", "acme", "strict", "elsewhere", "limited")}


def add_key(tenants_file: Path, tenant: str, create: bool = False) -> str:
    """Run `fleetgate tenants add-key` and return the key it printed."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert fleetgate(["tenants", "add-key", str(tenants_file), tenant] + (["--create"] if create else [])) == 0
    return out.getvalue().strip()


def auth(key: str) -> dict[str, str]:
    """The Authorization header for ``key``."""
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="session")
def serve_work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the deployment's config copy and its `serve run` log live."""
    return tmp_path_factory.mktemp("serve")


@pytest.fixture(scope="session")
def base_url(tiny_model_path: Path, redis_url: str, tenants_file: Path, api_keys: dict[str, str],
             serve_work_dir: Path) -> Iterator[str]:
    """Base URL of the running deployment."""

    def for_tests(args: dict) -> None:
        args["gateway"]["num_replicas"] = GATEWAY_REPLICAS
        args["access"] = {"tenants_file": str(tenants_file), "allow_anonymous": False, "reload_interval_s": 0.5,
                          "isolate_prefix_cache": True}  # the default: every request carries its salt
        args["metrics"] = {"publish_interval_s": 1.0, "scrape_key_sha256": hash_key(SCRAPE_KEY)}
        args["queue"]["redis_max_connections"] = REDIS_CONNECTIONS

    def every_replica_up() -> bool:  # vLLM replicas registered their capacity; gateways publish metrics
        client = redis.Redis.from_url(redis_url)
        keys = QueueKeys(namespace="local")
        gateways = [s for s in client.smembers(keys.metrics_sources()) if s.startswith(b"gateway:")]
        return len(snapshot(redis_url).replicas) == REPLICAS and len(gateways) == GATEWAY_REPLICAS

    with serve_run(REPO_ROOT / "deploy" / "local.yaml", serve_work_dir,
                   env={"REDIS_URL": redis_url, "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"}, edit=for_tests,
                   ready=every_replica_up, ready_headers=auth(api_keys["calm"])) as url:
        yield url


FIRST_DIRECT_PORT = 30000  # Ray Serve's RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT default


@pytest.fixture(scope="module")
def direct_urls(base_url: str) -> list[str]:
    """The gateway replicas' own HTTP servers (Ray Serve hands ingress replicas ports from 30000 up)."""
    found = []
    for port in range(FIRST_DIRECT_PORT, FIRST_DIRECT_PORT + 8):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                found.append(f"http://127.0.0.1:{port}")
        except httpx.TransportError:
            continue
    return found
