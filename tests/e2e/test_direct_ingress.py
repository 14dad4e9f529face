"""Ray Serve's direct ingress (``RAY_SERVE_ENABLE_DIRECT_INGRESS=1``, as scripts/serve-local.sh starts it):
each gateway replica also serves HTTP on its own port, past the Serve proxy, and answers there as through
the proxy: a stream, the same headers and OpenAI-format errors, and a client that leaves mid-stream is
charged what its engine did."""

from __future__ import annotations

import httpx
import pytest

from bench.idle_probe import server_timing
from tests.conftest import TINY_MODEL_NAME
from tests.e2e.charging import assert_charged_what_its_engine_did, leave_a_stream
from tests.e2e.conftest import GATEWAY_REPLICAS, auth

pytestmark = pytest.mark.e2e


def test_each_gateway_replica_answers_on_its_own_port(direct_urls: list[str], api_keys: dict) -> None:
    assert len(direct_urls) == GATEWAY_REPLICAS, direct_urls
    gateways = set()
    for url in direct_urls:
        body = {"model": TINY_MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "stream": True}
        headers = {**auth(api_keys["calm"]), "x-priority": "interactive", "x-request-id": "direct-1"}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers,
                          timeout=60) as reply:
            assert reply.status_code == 200
            lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and any('"content"' in line for line in lines)
        assert reply.headers["x-fleetgate-band"] == "interactive"
        assert reply.headers["x-request-id"] == "direct-1"
        assert {"enqueue", "wait_grant", "serve_hops", "render", "engine"} <= server_timing(
            reply.headers["server-timing"]).keys()
        gateways.add(reply.headers["x-fleetgate-gateway"])

        refused = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)  # no key
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
    assert len(gateways) == GATEWAY_REPLICAS  # one port per gateway replica


def test_a_stream_left_on_a_direct_port_is_charged_what_its_engine_did(direct_urls: list[str], base_url: str,
                                                                      redis_url: str, api_keys: dict) -> None:
    assert_charged_what_its_engine_did(base_url, redis_url, "acme",
                                       lambda: leave_a_stream(direct_urls[0], api_keys["acme"]))
