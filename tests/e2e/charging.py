"""A client that leaves is charged what its engine did: the check, shared by the tests that leave a request
through the Serve proxy and through a gateway's own port."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import TINY_MODEL_NAME
from tests.e2e.conftest import REPLICAS, SCRAPE_KEY, auth
from tests.ledger import assert_ledger_balanced, served_by_tenant

LONG_RUN = {"model": TINY_MODEL_NAME, "prompt": "run for a while", "max_tokens": 3000, "ignore_eos": True}


def engine_tokens(base_url: str) -> float:
    """Prompt + generated tokens every vLLM engine has counted (vLLM's own counters), once the published
    figure holds still for over two publish intervals (each replica publishes every second)."""
    names = {"vllm:prompt_tokens", "vllm:generation_tokens"}
    readings: list[tuple[float, float]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = httpx.get(f"{base_url}/metrics", headers=auth(SCRAPE_KEY), timeout=30).text
        now = sum(s.value for f in text_string_to_metric_families(text) if f.name in names
                  for s in f.samples if s.name.endswith("_total"))
        readings = [r for r in readings if r[1] == now] + [(time.monotonic(), now)]
        if readings[-1][0] - readings[0][0] > 2.5:
            return now
        time.sleep(0.25)
    raise AssertionError(f"the engines' token counters never held still: {readings}")


def leave_a_stream(url: str, key: str) -> None:
    """Start a long streamed completion at ``url``, read some of it, then leave."""
    with httpx.stream("POST", f"{url}/v1/completions", headers=auth(key), json={**LONG_RUN, "stream": True},
                      timeout=30) as reply:
        lines = reply.iter_lines()
        for _ in range(40):  # some of the stream, then the client leaves
            next(lines)


def assert_charged_what_its_engine_did(base_url: str, redis_url: str, tenant: str,
                                       request: Callable[[], None]) -> None:
    """Run ``request`` (a request of ``tenant`` that ends before its reply does: its client leaves, or its
    engine fails it), then check that the tenant was charged what the engines counted for it, give or take a
    step, and that the ledger balances."""
    before, engines_before = served_by_tenant(redis_url), engine_tokens(base_url)
    request()
    state = assert_ledger_balanced(redis_url, REPLICAS)  # its slot and tokens came back
    charged = state.served[tenant] - before.get(tenant, 0)
    assert 10 < charged < 3000  # at least its prompt (the engine ran it), less than its estimate
    engines = engine_tokens(base_url) - engines_before
    assert abs(engines - charged) <= 2, (engines, charged)  # what the engines counted, give or take a step
