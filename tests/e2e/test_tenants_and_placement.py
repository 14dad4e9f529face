"""End to end: tenants, headers, rate limits, token counts, length-aware placement and metrics.

Through the `serve run` deployment (2 gateways, a latency pool and a throughput pool of one vLLM replica
each, 4 slots apiece), with API keys required and the tests' tenants file.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import TINY_MODEL_NAME
from tests.e2e.charging import LONG_RUN, assert_charged_what_its_engine_did, leave_a_stream
from tests.e2e.conftest import (
    GATEWAY_REPLICAS, RATE_LIMIT_RPM, REPLICAS, SCRAPE_KEY, SLOTS_PER_REPLICA, add_key, auth,
)
from tests.ledger import assert_ledger_balanced, snapshot

pytestmark = pytest.mark.e2e

ERROR_KEYS = {"message", "type", "param", "code"}
LONG_PROMPT = "the fleet gateway " * 300  # ~900 tokens: the "long" class (over 512)


def _completion(base_url: str, headers: dict, prompt: str = "Hello", max_tokens: int = 2, **body) -> httpx.Response:
    payload = {"model": TINY_MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **body}
    return httpx.post(f"{base_url}/v1/completions", json=payload, headers=headers, timeout=120)


def _error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS and error["code"] == code, error
    return error


def test_missing_malformed_or_unknown_key_is_401(base_url: str) -> None:
    for headers in ({}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer fg-not-a-key"}):
        response = _completion(base_url, headers)
        error = _error(response, 401, "invalid_api_key")
        assert error["type"] == "authentication_error"
        assert response.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{base_url}/v1/models").status_code == 401


def test_model_the_tenant_may_not_use_is_403_and_not_listed(base_url: str, api_keys: dict) -> None:
    _error(_completion(base_url, auth(api_keys["elsewhere"])), 403, "permission_denied")
    listed = httpx.get(f"{base_url}/v1/models", headers=auth(api_keys["elsewhere"]))
    assert listed.status_code == 200 and listed.json()["data"] == []
    retrieved = httpx.get(f"{base_url}/v1/models/{TINY_MODEL_NAME}", headers=auth(api_keys["elsewhere"]))
    assert retrieved.status_code == 404 and retrieved.json()["error"]["code"] == "model_not_found"


def test_band_above_allowance_is_capped_and_the_response_says_so(base_url: str, api_keys: dict) -> None:
    response = _completion(base_url, {**auth(api_keys["acme"]), "x-priority": "interactive"})
    assert response.status_code == 200, response.text
    assert response.headers["x-fleetgate-band"] == "standard"
    assert response.headers["x-fleetgate-band-capped"] == "true"
    assert response.headers["x-fleetgate-requested-band"] == "interactive"
    within = _completion(base_url, {**auth(api_keys["acme"]), "x-priority": "batch"})
    assert within.headers["x-fleetgate-band"] == "batch" and "x-fleetgate-band-capped" not in within.headers


def test_band_above_allowance_is_403_for_a_refusing_tenant(base_url: str, api_keys: dict) -> None:
    error = _error(_completion(base_url, {**auth(api_keys["strict"]), "x-priority": "standard"}), 403,
                   "permission_denied")
    assert error["param"] == "x-priority"
    assert _completion(base_url, auth(api_keys["strict"])).headers["x-fleetgate-band"] == "batch"


def test_inference_extension_aliases(base_url: str, api_keys: dict) -> None:
    headers = {**auth(api_keys["calm"]), "x-gateway-inference-objective": "offline",
               "x-gateway-inference-fairness-id": "user:42"}
    response = _completion(base_url, headers)
    assert response.status_code == 200, response.text
    assert response.headers["x-fleetgate-band"] == "batch"
    bad = _completion(base_url, {**auth(api_keys["calm"]), "x-gateway-inference-objective": "nope"})
    assert _error(bad, 400, "invalid_header")["param"] == "x-gateway-inference-objective"
    bad = _completion(base_url, {**auth(api_keys["calm"]), "x-slo-ttft-ms": "soon"})
    assert _error(bad, 400, "invalid_header")["param"] == "x-slo-ttft-ms"


def test_request_id_is_honoured_or_generated_and_echoed(base_url: str, api_keys: dict) -> None:
    sent = _completion(base_url, {**auth(api_keys["calm"]), "x-request-id": "trace-abc-123"})
    assert sent.headers["x-request-id"] == "trace-abc-123"
    generated = _completion(base_url, auth(api_keys["calm"]))
    assert "," not in generated.headers["x-request-id"] and len(generated.headers["x-request-id"]) >= 16
    failed = _completion(base_url, {"x-request-id": "trace-401"})
    assert failed.status_code == 401 and failed.headers["x-request-id"] == "trace-401"


def test_prompt_tokens_equal_vllms_own_count(base_url: str, api_keys: dict) -> None:
    chat = httpx.post(f"{base_url}/v1/chat/completions", headers=auth(api_keys["calm"]), timeout=60, json={
        "model": TINY_MODEL_NAME, "max_tokens": 2,
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there!"},
                     {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Count me " * 40}],
    })
    assert chat.status_code == 200, chat.text
    assert int(chat.headers["x-fleetgate-prompt-tokens"]) == chat.json()["usage"]["prompt_tokens"]
    completion = _completion(base_url, auth(api_keys["calm"]), prompt="Once upon a time, in a fleet far away")
    assert int(completion.headers["x-fleetgate-prompt-tokens"]) == completion.json()["usage"]["prompt_tokens"]
    tool = {"type": "function", "function": {"name": "lookup", "description": "Find a record " * 30,
                                             "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}
    with_tools = httpx.post(f"{base_url}/v1/chat/completions", headers=auth(api_keys["calm"]), timeout=60, json={
        "model": TINY_MODEL_NAME, "max_tokens": 2, "tools": [tool], "tool_choice": "none",
        "messages": [{"role": "user", "content": "Hello there!"}],
    })  # the template renders the tools: they are prompt tokens, counted as vLLM counts them
    assert with_tools.status_code == 200, with_tools.text
    counted = int(with_tools.headers["x-fleetgate-prompt-tokens"])
    assert counted == with_tools.json()["usage"]["prompt_tokens"] and counted > 100
    # an agent's turn as vLLM prepares it: no content beside tool calls, arguments as an object, a tool result
    # in parts, and a tool whose description vLLM's protocol dumps as null
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"id": "42"}'}}
    agent = httpx.post(f"{base_url}/v1/chat/completions", headers=auth(api_keys["calm"]), timeout=60, json={
        "model": TINY_MODEL_NAME, "max_tokens": 2, "tool_choice": "none",
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
        "messages": [{"role": "user", "content": "Find 42."}, {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "found"},
                                                                        {"type": "text", "text": "it"}]}],
    })
    assert agent.status_code == 200, agent.text
    assert int(agent.headers["x-fleetgate-prompt-tokens"]) == agent.json()["usage"]["prompt_tokens"]


def test_an_agents_tool_choices_are_served_by_the_shipped_parser(base_url: str, api_keys: dict) -> None:
    """deploy/local.yaml runs vLLM's tool-call parser: a chat with tools and no tool choice (what agent
    clients send: "auto"), "required" and a named function are served, and counted as vLLM counts them (the
    gateway refuses them before the queue only where the replicas run no parser: tests/unit)."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}}
    body = {"model": TINY_MODEL_NAME, "max_tokens": 4, "tools": [tool],
            "messages": [{"role": "user", "content": "find 42"}]}
    for choice in (None, "auto", "required", {"type": "function", "function": {"name": "lookup"}}):
        sent = body if choice is None else {**body, "tool_choice": choice}
        served = httpx.post(f"{base_url}/v1/chat/completions", json=sent, headers=auth(api_keys["calm"]), timeout=60)
        assert served.status_code == 200, (choice, served.text)
        assert int(served.headers["x-fleetgate-prompt-tokens"]) == served.json()["usage"]["prompt_tokens"]
    # streamed, every token goes through the parser (the tiny model's text holds no call, nor under a forced
    # choice a whole one: its arguments are noise that can run past max_tokens)
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json={**body, "stream": True},
                      headers=auth(api_keys["calm"]), timeout=60) as stream:
        assert stream.status_code == 200
        events = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and all('"error"' not in event for event in events)


def test_fan_out_is_in_the_estimate_and_a_batch_is_checked_prompt_by_prompt(base_url: str, api_keys: dict) -> None:
    # three prompts of ~1,500 tokens: each fits the 4,096-token context, together they do not
    batch = [f"{i} " + "the fleet gateway " * 500 for i in range(3)]
    response = _completion(base_url, auth(api_keys["calm"]), prompt=batch, max_tokens=2)
    assert response.status_code == 200, response.text
    assert int(response.headers["x-fleetgate-prompt-tokens"]) == response.json()["usage"]["prompt_tokens"]
    assert response.headers["x-fleetgate-length-class"] == "long"  # its longest prompt's class


def test_a_client_that_gives_up_is_charged_what_its_engine_did(base_url: str, redis_url: str,
                                                               api_keys: dict) -> None:
    """A non-streamed reply whose client times out was refunded in full once, so tenants whose clients always
    time out won every grant; then it was charged its estimate. Now the gateway stops it on its replica and
    charges the tokens the engine served, from vLLM's usage in the stopped reply."""

    def give_up() -> None:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base_url}/v1/completions", headers=auth(api_keys["acme"]), json=LONG_RUN,
                       timeout=1.5)

    assert_charged_what_its_engine_did(base_url, redis_url, "acme", give_up)


def test_a_stream_its_client_leaves_is_charged_what_its_engine_did(base_url: str, redis_url: str,
                                                                  api_keys: dict) -> None:
    """A client that leaves mid-stream is charged the engine's count as of its last chunk, which is what the
    engine served give or take a step (a stream is charged by vLLM's usage, never by its chunks)."""
    assert_charged_what_its_engine_did(base_url, redis_url, "acme",
                                       lambda: leave_a_stream(base_url, api_keys["acme"]))


def test_a_reply_running_past_its_estimate_is_charged_while_it_runs(base_url: str, redis_url: str,
                                                                     api_keys: dict) -> None:
    """Without max_tokens a chat is estimated at its prompt and queue.default_output_tokens (128), and the
    tiny model runs on toward its context's end. Its replica reports what the engine has served, and the
    tenant is charged as it runs, before the reply (not streamed: the gateway cannot watch it) ends; the
    client then leaves, and the tenant is charged what its engine did, once."""

    def counter() -> float:
        return sum(band.counters.get("acme", 0.0) for band in snapshot(redis_url).bands)

    async def run_past_then_leave() -> None:
        body = {"model": TINY_MODEL_NAME, "messages": [{"role": "user", "content": "run on"}], "temperature": 0}
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            before = counter()
            reply = asyncio.ensure_future(client.post("/v1/chat/completions", json=body,
                                                      headers=auth(api_keys["acme"])))
            deadline, seen = time.monotonic() + 60, [before]
            while len(seen) < 3:  # the grant's charge, then a top-up, while the reply runs
                assert time.monotonic() < deadline and not reply.done(), (seen, reply.done() and reply.result().text)
                if (now := counter()) != seen[-1]:
                    seen.append(now)
                await asyncio.sleep(0.05)
            assert seen[2] > seen[1] > seen[0]
            reply.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reply

    assert_charged_what_its_engine_did(base_url, redis_url, "acme", lambda: asyncio.run(run_past_then_leave()))


def test_beam_search_only_in_the_top_band(base_url: str, api_keys: dict) -> None:
    """vLLM's beam search ignores request priority (it runs at 0): a lower band may not use it to jump ahead."""
    body = {"use_beam_search": True, "n": 2, "max_tokens": 2}
    refused = _completion(base_url, {**auth(api_keys["calm"]), "x-priority": "batch"}, **body)
    assert _error(refused, 400, "invalid_value")["param"] == "use_beam_search"
    allowed = _completion(base_url, {**auth(api_keys["calm"]), "x-priority": "interactive"}, **body)
    assert allowed.status_code == 200, allowed.text


def test_a_request_cannot_bring_its_own_template_options_or_engine_handles(base_url: str, api_keys: dict) -> None:
    messages = [{"role": "user", "content": "hi"}]
    for extra, param in (({"chat_template": "{% for i in range(99999999) %}x{% endfor %}"}, "chat_template"),
                         ({"chat_template_kwargs": {"tokenize": False}}, "chat_template_kwargs"),
                         ({"vllm_xargs": {"kv_transfer_params": "x"}}, "vllm_xargs"),
                         ({"ec_transfer_params": {"x": 1}}, "ec_transfer_params"),
                         ({"messages": []}, "messages")):
        response = httpx.post(f"{base_url}/v1/chat/completions", headers=auth(api_keys["calm"]), timeout=30,
                              json={"model": TINY_MODEL_NAME, "max_tokens": 2, "messages": messages, **extra})
        assert _error(response, 400, "invalid_value")["param"] == param


def test_rate_limit_holds_across_both_gateways(base_url: str, api_keys: dict, direct_urls: list[str]) -> None:
    async def burst() -> tuple[list[httpx.Response], list[httpx.Response], float]:
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            body = {"model": TINY_MODEL_NAME, "prompt": "quick", "max_tokens": 1}
            sent = [asyncio.create_task(client.post("/v1/completions", json=body, headers=auth(api_keys["limited"])))
                    for _ in range(2 * RATE_LIMIT_RPM)]
            # a gateway that saw the queue refuse the tenant refuses its next requests from the headers, until
            # the bucket could take one again (3 s at 20 a minute): a body it never reads (invalid JSON) gets
            # the 429, not a 400. Sent to each gateway's own port (Serve's proxy may route them all to one that
            # saw no refusal), at the first refusal, while the admitted requests are still served.
            unread: list[httpx.Response] = []
            for arriving in asyncio.as_completed(sent):
                if (await arriving).status_code == 429:
                    unread = await asyncio.gather(*(client.post(
                        f"{url}/v1/completions", content=b"{not json",
                        headers={**auth(api_keys["limited"]), "content-type": "application/json"})
                        for url in direct_urls for _ in range(2)))
                    break
            replies = await asyncio.gather(*sent)
        return replies, unread, time.monotonic() - started

    replies, unread, elapsed_s = asyncio.run(burst())
    passed = [r for r in replies if r.status_code == 200]
    limited = [r for r in replies if r.status_code == 429]
    assert len(passed) + len(limited) == len(replies)
    refilled = int(elapsed_s * RATE_LIMIT_RPM / 60)  # the bucket refills while the burst is served
    assert RATE_LIMIT_RPM <= len(passed) <= RATE_LIMIT_RPM + refilled, (len(passed), elapsed_s)
    # both gateways took part (every answer, rejections too, names its gateway), yet the limit held overall
    assert len({r.headers["x-fleetgate-gateway"] for r in replies}) == GATEWAY_REPLICAS
    for response in limited:
        assert _error(response, 429, "rate_limit_exceeded")["type"] == "rate_limit_error"
        assert response.headers["x-fleetgate-rejected-reason"] == "rate-limited"
        assert int(response.headers["retry-after"]) >= 1
    seen = [(r.status_code, r.headers.get("x-fleetgate-gateway")) for r in unread]
    refusers = {r.headers["x-fleetgate-gateway"] for r in limited}
    assert {r.status_code for r in unread} <= {400, 429} and any(r.status_code == 429 for r in unread), (seen, refusers)
    assert {r.headers["x-fleetgate-gateway"] for r in unread if r.status_code == 429} <= refusers
    assert all(r.headers["x-fleetgate-rejected-reason"] == "rate-limited" for r in unread if r.status_code == 429)


def test_long_prompts_run_on_the_throughput_pool(base_url: str, api_keys: dict) -> None:
    long = _completion(base_url, auth(api_keys["calm"]), prompt=LONG_PROMPT)
    assert long.status_code == 200, long.text
    assert long.headers["x-fleetgate-length-class"] == "long"
    assert long.headers["x-fleetgate-pool"] == "throughput"
    short = _completion(base_url, auth(api_keys["calm"]))
    assert (short.headers["x-fleetgate-length-class"], short.headers["x-fleetgate-pool"]) == ("short", "latency")


def _engines_running(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics", headers=auth(SCRAPE_KEY), timeout=30).text
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == "vllm:num_requests_running"
               for s in f.samples)


def test_short_prompts_spill_over_and_a_deadline_expires_in_a_full_fleet(base_url: str, redis_url: str,
                                                                         api_keys: dict) -> None:
    """Also: clients that leave while queued or mid-stream leave nothing behind (ticket, slot, engine work)."""

    async def scenario() -> tuple[list[str], httpx.Response]:
        body = {"model": TINY_MODEL_NAME, "prompt": "keep going", "max_tokens": 3000, "ignore_eos": True,
                "stream": True}
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client, contextlib.AsyncExitStack() as streams:
            holders = await asyncio.gather(*(
                streams.enter_async_context(client.stream("POST", "/v1/completions", json=body,
                                                          headers=auth(api_keys["flood"])))
                for _ in range(2 * SLOTS_PER_REPLICA)))  # every slot of both pools
            pools = [r.headers["x-fleetgate-pool"] for r in holders]
            late = await client.post("/v1/completions", headers={**auth(api_keys["calm"]), "x-slo-ttft-ms": "300"},
                                     json={"model": TINY_MODEL_NAME, "prompt": "too late", "max_tokens": 2})
            with pytest.raises(httpx.ReadTimeout):  # a client that gives up while its request is queued
                await client.post("/v1/completions", headers=auth(api_keys["calm"]), timeout=1.0,
                                  json={"model": TINY_MODEL_NAME, "prompt": "impatient", "max_tokens": 2})
            deadline = time.monotonic() + 10  # its ticket is withdrawn: only the 8 holders' tickets remain
            while (await asyncio.to_thread(snapshot, redis_url)).tickets != 2 * SLOTS_PER_REPLICA:
                assert time.monotonic() < deadline, "an abandoned request's ticket stayed in the queue"
                await asyncio.sleep(0.1)
        return pools, late  # leaving the block closes the streams mid-way: the engine requests are aborted

    pools, late = asyncio.run(scenario())
    assert sorted(pools) == ["latency"] * SLOTS_PER_REPLICA + ["throughput"] * SLOTS_PER_REPLICA
    _error(late, 429, "queue_timeout")
    assert late.headers["x-fleetgate-rejected-reason"] == "rejected-ttl-expired"
    assert_ledger_balanced(redis_url, REPLICAS)  # no ticket left, every slot and KV token back
    deadline = time.monotonic() + 15
    while _engines_running(base_url) > 0:  # the engines aborted the abandoned streams (not run to 3000 tokens)
        assert time.monotonic() < deadline, "vLLM kept running requests nobody reads"
        time.sleep(0.3)


def test_tenants_file_reloads_without_restart(base_url: str, tenants_file: Path) -> None:
    key = add_key(tenants_file, "newcomer", create=True)
    deadline = time.monotonic() + 20
    while (response := _completion(base_url, auth(key))).status_code == 401:
        assert time.monotonic() < deadline, "the new key was not picked up"
        time.sleep(0.2)
    assert response.status_code == 200, response.text


def test_metrics_show_every_gateway_replica_and_the_queue(base_url: str, api_keys: dict) -> None:
    _completion(base_url, {**auth(api_keys["calm"]), "x-priority": "interactive"}, stream=True, max_tokens=4)

    def scrape() -> dict:
        text = httpx.get(f"{base_url}/metrics", headers=auth(SCRAPE_KEY), timeout=30).text
        return {f.name: f for f in text_string_to_metric_families(text)}

    def interactive_ttft(families: dict) -> float:
        return sum(s.value for s in families["fleetgate_time_to_first_token_seconds"].samples
                   if s.name.endswith("_count") and s.labels["band"] == "interactive")

    # the stream may have run on the other gateway, whose series arrive within one publish interval (1 s)
    deadline = time.monotonic() + 10
    while interactive_ttft(families := scrape()) < 1:
        assert time.monotonic() < deadline, "the stream's TTFT never appeared"
        time.sleep(0.2)
    assert httpx.get(f"{base_url}/metrics", timeout=30).status_code == 401  # the scrape key is required
    assert httpx.get(f"{base_url}/metrics", headers=auth(api_keys["calm"]), timeout=30).status_code == 401
    grants = families["fleetgate_grants"].samples
    assert {s.labels["gateway"] for s in grants} and {s.labels["pool"] for s in grants} == {"latency", "throughput"}
    assert any(s.labels["tenant"] == "calm" and s.labels["band"] == "interactive" for s in grants)
    gateways = {s.labels["gateway"] for s in families["fleetgate_requests"].samples}
    assert len(gateways) == GATEWAY_REPLICAS
    reasons = {s.labels["reason"] for s in families["fleetgate_rejections"].samples}
    assert {"rate-limited", "rejected-ttl-expired"} <= reasons
    assert any(s.name.endswith("_count") and s.value > 0
               for s in families["fleetgate_inter_token_latency_seconds"].samples)
    assert any(s.name.endswith("_count") for s in families["fleetgate_queue_wait_seconds"].samples)
    assert "fleetgate_queue_depth" in families and "fleetgate_queued_tokens" in families
    guard = families["fleetgate_header_guard_missing"].samples  # the launcher starts Ray with the guard
    assert len(guard) == GATEWAY_REPLICAS and all(s.value == 0 for s in guard)
    slots = {s.labels["pool"]: s.value for s in families["fleetgate_replica_slots"].samples}
    assert slots == {"latency": SLOTS_PER_REPLICA, "throughput": SLOTS_PER_REPLICA}
    running = families["vllm:num_requests_running"].samples
    assert {s.labels["pool"] for s in running} == {"latency", "throughput"}
    assert all(s.labels["replica"] for s in running)


def test_status_cli_shows_the_live_fleet(base_url: str, redis_url: str, capsys: pytest.CaptureFixture) -> None:
    from gateway.cli import main as fleetgate
    from tests.conftest import REPO_ROOT

    assert fleetgate(["status", "--config", str(REPO_ROOT / "deploy" / "local.yaml"), "--redis-url", redis_url]) == 0
    view = capsys.readouterr().out
    assert "latency" in view and "throughput" in view and f"0/{SLOTS_PER_REPLICA}" in view
    assert f"gateways publishing: {GATEWAY_REPLICAS}" in view
