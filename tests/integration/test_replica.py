"""The vLLM replica deployment under real Ray Serve with a real vLLM CPU engine.

One replica, driven through its DeploymentHandle: vLLM's serving path, its error mapping, priority
scheduling, the abort of an engine request when the caller goes away, and its engine signals in the global
queue (what vLLM's scheduler reports each step, the requests it has not started, granted tickets
acknowledged, and what a request running past its estimate has served, charged as it runs).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from fleet.config import QueueConfig
from fleet.connection import global_queue
from fleet.snapshot import ReplicaState
from policies.types import TicketSpec
from replicas.cpu_binding import CpuBinding
from replicas.engine_settings import EngineSettings
from replicas.spec import ReplicaSpec
from tests.conftest import REPO_ROOT, TINY_MODEL_NAME

pytestmark = pytest.mark.integration

ENGINE = EngineSettings(
    max_num_batched_tokens=128,
    max_num_seqs=8,
    max_model_len=4096,
    scheduling_policy="priority",
    enforce_eager=True,
    kv_cache_memory_bytes=256 << 20,
    extra_args=["--chat-template-content-format", "string"],  # not the model's own: the gateway must follow
)


@pytest.fixture(scope="module")
def queue_config(redis_url: str) -> QueueConfig:
    QUEUE["config"] = QueueConfig(redis_url=redis_url, namespace=f"replica{uuid.uuid4().hex[:8]}",
                                  signal_heartbeat_s=0.2, signal_stale_s=1.0, progress_interval_s=0.2)
    return QUEUE["config"]


@pytest.fixture(scope="module")
def replica(tiny_model_path: Path, queue_config: QueueConfig) -> Iterator[object]:
    import ray
    from ray import serve

    from replicas.deployment import VLLMReplica

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    deployment = serve.deployment(VLLMReplica).options(name="vllm-it", ray_actor_options={"num_cpus": 0.5})
    app = deployment.bind(ReplicaSpec(
        model_path=str(tiny_model_path), served_model_name=TINY_MODEL_NAME, engine=ENGINE.model_dump(),
        cpu_binding=CpuBinding(cores_per_replica=1), cache_dir=str(REPO_ROOT / ".cache" / "runtime"),
        queue=queue_config,
    ))
    handle = serve.run(app, name="replica-it", route_prefix=None)
    yield handle
    serve.shutdown()
    ray.shutdown()
    # a graceful stop deregisters at once: the replica is gone well before its 10 s lease would lapse
    queue = global_queue(queue_config, aioredis.Redis.from_url(queue_config.redis_url))
    assert asyncio.run(queue.snapshot()).replicas == []  # a read: it reaps nothing


async def _collect(replica, endpoint: str, body: dict, prompt_tokens: int = 0) -> list:
    """The replica's messages for one call, under a grant the queue made to it (it serves no other)."""
    queue = _queue()
    ticket = uuid.uuid4().hex
    (grant,) = (await queue.enqueue(TicketSpec(ticket, "acme", "interactive", 10))).grants
    try:
        return [item async for item in replica.options(stream=True).generate.remote(
            endpoint, body, granted_replica=grant.replica_id, ticket_id=ticket, prompt_tokens=prompt_tokens)]
    finally:
        await queue.complete(ticket, 10)


QUEUE: dict[str, QueueConfig] = {}


def _queue():
    config = QUEUE["config"]
    return global_queue(config, aioredis.Redis.from_url(config.redis_url))


async def test_arguments_a_newer_gateway_adds_are_ignored(replica) -> None:
    """Gateways and replicas of two releases meet during a rolling update: a newer gateway's extra arguments
    must not fail the call."""
    queue = _queue()
    (grant,) = (await queue.enqueue(TicketSpec("t-newer", "acme", "interactive", 10))).grants
    body = {"model": TINY_MODEL_NAME, "prompt": "The gateway", "max_tokens": 3, "ignore_eos": True}
    try:
        (header,) = [item async for item in replica.options(stream=True).generate.remote(
            "completion", body, granted_replica=grant.replica_id, ticket_id="t-newer", a_later_option=True)]
        assert header["status"] == 200 and header["body"]["usage"]["completion_tokens"] == 3
        assert await replica.served.remote("t-newer", 5.0, granted_replica=grant.replica_id,
                                           a_later_option=True) is not None
    finally:
        await queue.complete("t-newer", 10)


async def test_completion_with_priority(replica) -> None:
    body = {"model": TINY_MODEL_NAME, "prompt": "The gateway", "max_tokens": 5, "ignore_eos": True,
            "priority": 7}  # vLLM rejects a non-zero priority unless priority scheduling is on
    (header,) = await _collect(replica, "completion", body)
    assert header["status"] == 200 and not header["stream"]
    assert header["body"]["usage"]["completion_tokens"] == 5


async def test_chat_stream_yields_sse_lines_then_done(replica) -> None:
    body = {"model": TINY_MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "ignore_eos": True, "stream": True}
    header, *lines = await _collect(replica, "chat", body)
    timings = header.pop("timings")
    assert header == {"status": 200, "body": None, "stream": True, "served": None}
    # where the replica's part of the wait went: its grant check, vLLM's render, the engine to the first token
    assert set(timings) == {"grant_check", "render", "engine", "replica"} and min(timings.values()) >= 0
    assert timings["engine"] > 0
    assert timings["replica"] >= timings["grant_check"] + timings["render"] + timings["engine"]
    assert all(line.startswith("data: ") and line.endswith("\n\n") for line in lines)
    assert lines[-1] == "data: [DONE]\n\n"
    assert len(lines) >= 4


async def test_the_gateway_counts_a_chat_as_this_replica_renders_it(replica, tiny_model_path: Path) -> None:
    """The gateway's renderer, set up from the replica's own engine arguments (a content format forced to
    "string": text parts joined by a newline), counts what the replica's vLLM counted, for an agent's turn."""
    from gateway.request_parsing import parse_request
    from gateway.tokens import PromptTokenCounter

    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"id": 42}'}}
    body = {"model": TINY_MODEL_NAME, "max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "find"}, {"type": "text", "text": "record 42"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "found"}]}]}
    (header,) = await _collect(replica, "chat", body)
    assert header["status"] == 200, header
    served = header["body"]["usage"]["prompt_tokens"]
    model = str(tiny_model_path)
    parsed = parse_request(json.dumps(body).encode(), "chat")
    assert PromptTokenCounter(model, ENGINE.to_cli_args(model, TINY_MODEL_NAME)).count(parsed) == [served]
    assert PromptTokenCounter(model).count(parsed) != [served]  # the model folder alone renders otherwise


async def test_prompt_over_context_is_a_400_from_vllm(replica) -> None:
    body = {"model": TINY_MODEL_NAME, "prompt": "hello world " * 3000, "max_tokens": 4}
    (header,) = await _collect(replica, "completion", body)
    assert header["status"] == 400
    assert "maximum context length" in header["body"]["error"]["message"]


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
@pytest.mark.parametrize("stream", [False, True], ids=["full", "streamed"])
async def test_a_grammar_that_admits_no_output_is_a_400_that_charges_the_engines_work(replica, stream: bool,
                                                                                    endpoint: str) -> None:
    """vLLM's engine ends such a request in error after its prefill, and vLLM answers 500 (a chat stream: after
    its role chunk). The replica answers 400 naming the field, with the prompt the engine prefilled as served."""
    prompt = {"messages": [{"role": "user", "content": "hi"}]} if endpoint == "chat" else {"prompt": "hi"}
    body = {"model": TINY_MODEL_NAME, **prompt, "max_tokens": 4, "structured_outputs": {"regex": "[^\\s\\S]"},
            "stream": stream}
    (header,) = await _collect(replica, endpoint, body, prompt_tokens=13)
    assert header["status"] == 400, header
    assert header["body"]["error"]["param"] == "structured_outputs" and header["served"] == 13
    assert await replica.unfinished_requests.remote() == 0


async def test_a_grammar_that_dead_ends_after_output_says_so_in_its_stream(replica) -> None:
    body = {"model": TINY_MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
            "structured_outputs": {"regex": "a[^\\s\\S]"}}  # "a", then nothing can follow
    header, *lines = await _collect(replica, "chat", body, prompt_tokens=13)
    assert header["status"] == 200 and header["stream"]
    errors = [json.loads(event[len("data: "):])["error"] for line in lines for event in line.split("\n\n")
              if event.startswith('data: {"error"')]
    assert [(e["code"], e["param"]) for e in errors] == [(400, "structured_outputs")], lines


async def test_a_stream_that_fails_before_its_first_token_answers_with_the_errors_status(replica) -> None:
    body = {"model": TINY_MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "string", "minLength": 5, "maxLength": 2}}}}
    (header,) = await _collect(replica, "chat", body, prompt_tokens=13)
    assert header["status"] == 400 and not header["stream"], header
    assert "Unsatisfiable schema" in header["body"]["error"]["message"]
    assert header["served"] == 0  # refused before the engine took it


async def test_a_call_without_a_grant_to_this_replica_is_refused(replica) -> None:
    body = {"model": TINY_MODEL_NAME, "prompt": "x", "max_tokens": 2}
    for grant in ({}, {"ticket_id": "forged"}):  # no grant; a ticket the queue never granted here
        replies = [item async for item in replica.options(stream=True).generate.remote("completion", body, **grant)]
        assert [r["status"] for r in replies] == [403] and replies[0]["body"]["error"]["code"] == "no_grant"


async def test_cancelled_caller_aborts_the_engine_request(replica) -> None:
    body = {"model": TINY_MODEL_NAME, "prompt": "x", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    queue = _queue()
    (grant,) = (await queue.enqueue(TicketSpec("t-abort", "acme", "interactive", 10))).grants
    replies = replica.options(stream=True).generate.remote("completion", body, granted_replica=grant.replica_id,
                                                           ticket_id="t-abort")
    header = await replies.__anext__()
    assert header["stream"]
    for _ in range(3):
        await replies.__anext__()
    assert await replica.unfinished_requests.remote() == 1
    cancelled_at = time.monotonic()
    replies.cancel()
    # 4000 tokens would take this engine well over 10 s; an abort frees the engine at once.
    while await replica.unfinished_requests.remote() != 0:
        assert time.monotonic() - cancelled_at < 5.0, "the engine request was not aborted"
        await asyncio.sleep(0.05)
    await queue.complete("t-abort", 10)


async def _replica_state(config: QueueConfig, until, timeout_s: float = 10) -> ReplicaState:
    """The replica as the queue sees it, once ``until`` holds (its reports arrive every step or heartbeat)."""
    queue = global_queue(config, aioredis.Redis.from_url(config.redis_url))
    deadline = time.monotonic() + timeout_s
    while True:
        (state,) = (await queue.snapshot()).replicas
        if until(state):
            return state
        assert time.monotonic() < deadline, f"the replica's report never showed it: {state}"
        await asyncio.sleep(0.05)


async def test_engine_signals_reach_the_queue_and_grants_are_acknowledged(replica, queue_config: QueueConfig) -> None:
    queue = global_queue(queue_config, aioredis.Redis.from_url(queue_config.redis_url))
    # earlier tests' requests are over (a report may still show one ending)
    idle = await _replica_state(queue_config, lambda s: s.fresh and s.running == 0 and s.unstarted == 0)
    assert (idle.unstarted, idle.in_flight, idle.kv_usage) == (0, 0, 0)
    assert idle.open_bands == queue_config.band_names
    (grant,) = (await queue.enqueue(TicketSpec("t-signals", "acme", "standard", 100))).grants
    busy = await _replica_state(queue_config, lambda s: s.in_flight == 1)  # granted, not yet arrived
    assert busy.pending == 100  # its prompt (the cost, no count given), up to the engine's 128-token step
    body = {"model": TINY_MODEL_NAME, "prompt": "x", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    replies = replica.options(stream=True).generate.remote("completion", body, granted_replica=grant.replica_id,
                                                           ticket_id=grant.ticket_id)
    await replies.__anext__()  # the header
    await replies.__anext__()  # the first token: started
    running = await _replica_state(queue_config, lambda s: s.running == 1 and s.in_flight == 0 and s.unstarted == 0)
    assert running.received >= 1 and running.kv_usage > 0 and running.pending == 0
    replies.cancel()
    await queue.complete("t-signals", 10)
    done = await _replica_state(queue_config, lambda s: s.running == 0)
    assert (done.unstarted, done.in_flight) == (0, 0)


async def test_sequences_of_a_grant_waiting_in_the_engine_count_as_not_started(replica,
                                                                                 queue_config: QueueConfig) -> None:
    """Two grants of n = 6 on an engine of 8 sequences: both requests have started a sequence, and four of the
    second's wait in the engine. The queue sees those four (it used to see none: a request counted as started
    with its first sequence), so its gate holds further work back."""
    queue = _queue()
    await _replica_state(queue_config, lambda s: s.fresh and s.running == 0 and s.unstarted == 0)
    body = {"model": TINY_MODEL_NAME, "prompt": "x", "max_tokens": 4000, "ignore_eos": True, "n": 6, "stream": True}
    calls = []
    for ticket in ("t-fan-1", "t-fan-2"):
        (grant,) = (await queue.enqueue(TicketSpec(ticket, "acme", "interactive", 10))).grants
        calls.append(replica.options(stream=True).generate.remote("completion", body, granted_replica=grant.replica_id,
                                                                  ticket_id=ticket))
        assert (await calls[-1].__anext__())["stream"]
    for call in calls:
        await call.__anext__()  # a first token: each request has started a sequence
    state = await _replica_state(queue_config, lambda s: s.running == 8)
    assert (state.unstarted, state.waiting) == (4, 4)
    for call in calls:
        call.cancel()
    for ticket in ("t-fan-1", "t-fan-2"):
        await queue.complete(ticket, 10)
    await _replica_state(queue_config, lambda s: s.running == 0 and s.unstarted == 0)


async def test_signals_go_stale_without_reports_and_the_gate_falls_back(replica, queue_config: QueueConfig) -> None:
    # seen from 5 s on (explicit clock; inside the replica's 10 s lease), its last report is stale
    queue = global_queue(queue_config, aioredis.Redis.from_url(queue_config.redis_url))
    state = await _replica_state(queue_config, lambda s: s.fresh)
    far_future = state.signals_at_ms + 5_000
    snapshot = await queue.snapshot(now_ms=far_future)
    assert snapshot.replicas[0].fresh  # a read changes nothing; the next call reaps
    await queue.expire(now_ms=far_future)
    assert not (await queue.snapshot(now_ms=far_future)).replicas[0].fresh
    assert (await _replica_state(queue_config, lambda s: s.fresh)).fresh  # its next heartbeat restores it


async def test_a_cancelled_call_records_what_its_engine_served(replica, queue_config: QueueConfig) -> None:
    """A client that leaves cancels the call; the replica still learns, and tells, what the engine served."""
    from replicas.base import GIVEN_UP

    body = {"model": TINY_MODEL_NAME, "prompt": "x", "max_tokens": 4000, "ignore_eos": True}
    queue = _queue()
    before = await _replica_state(queue_config, lambda s: s.fresh)
    (grant,) = (await queue.enqueue(TicketSpec("t-cut", "acme", "interactive", 10))).grants
    replies = replica.options(stream=True).generate.remote("completion", body, granted_replica=grant.replica_id,
                                                           ticket_id="t-cut")
    header = asyncio.ensure_future(replies.__anext__())
    # cut once its engine has produced a token (a report shows it received and no longer unstarted)
    await _replica_state(queue_config, lambda s: s.received > before.received and s.unstarted == 0 and s.running == 1)
    assert await replica.unfinished_requests.remote() == 1
    replies.cancel()
    served = await replica.served.remote("t-cut", 5.0, granted_replica=grant.replica_id)
    assert served is not None and 1 < served < 4000  # its prompt and the tokens generated before the cut
    assert await replica.unfinished_requests.remote() == 0  # and the engine stopped working on it
    header.cancel()
    await queue.complete("t-cut", served)
    # a call given up before it arrives: nothing ran (0), and when it does arrive it is answered at once
    (grant,) = (await queue.enqueue(TicketSpec("t-late", "acme", "interactive", 10))).grants
    assert await replica.served.remote("t-late", 5.0, granted_replica=grant.replica_id) == 0
    replies = [item async for item in replica.options(stream=True).generate.remote(
        "completion", body, granted_replica=grant.replica_id, ticket_id="t-late")]
    assert [r["status"] for r in replies] == [GIVEN_UP]
    await queue.complete("t-late", 0)


async def test_a_stream_cut_short_reports_the_engines_latest_count(replica) -> None:
    """The gateway charges a stream its client left by the engine's latest count; a replica that holds lines
    back for batching says what it read, which is at least what it had sent."""
    body = {"model": TINY_MODEL_NAME, "prompt": "x", "max_tokens": 4000, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    queue = _queue()
    (grant,) = (await queue.enqueue(TicketSpec("t-cut", "acme", "interactive", 10))).grants
    replies = replica.options(stream=True).generate.remote("completion", body, granted_replica=grant.replica_id,
                                                           ticket_id="t-cut")
    assert (await replies.__anext__())["stream"]
    sent = [await replies.__anext__() for _ in range(3)]
    sent_total = max(json.loads(line[len("data: "):])["usage"]["total_tokens"] for line in sent)
    replies.cancel()
    served = await replica.served.remote("t-cut", 5.0, granted_replica=grant.replica_id)
    assert served is not None and served >= sent_total > 1
    await queue.complete("t-cut", served)


async def test_a_stream_cut_before_its_first_token_reports_what_its_engine_holds(replica) -> None:
    """A stream's reply starts only with its first token (replicas/failed_replies.py): a client that leaves
    during the prefill is charged the prompt its engine took, not an estimate and not nothing."""
    body = {"model": TINY_MODEL_NAME, "prompt": [5] * 3000, "max_tokens": 4, "stream": True}  # 3,000 tokens
    queue = _queue()
    (grant,) = (await queue.enqueue(TicketSpec("t-prefill", "acme", "interactive", 10))).grants
    replies = replica.options(stream=True).generate.remote("completion", body, granted_replica=grant.replica_id,
                                                           ticket_id="t-prefill")
    header = asyncio.ensure_future(replies.__anext__())
    deadline = time.monotonic() + 30
    while await replica.unfinished_requests.remote() == 0:  # the engine has it: prefilling 128 tokens a step
        assert time.monotonic() < deadline and not header.done()
        await asyncio.sleep(0.005)
    replies.cancel()
    served = await replica.served.remote("t-prefill", 5.0, granted_replica=grant.replica_id)
    assert served is not None and 3000 <= served < 3010, served
    assert await replica.unfinished_requests.remote() == 0
    header.cancel()
    await queue.complete("t-prefill", served)


async def _counter(queue, band: str, tenant: str) -> float:
    snapshot = await queue.snapshot()
    return next(b for b in snapshot.bands if b.name == band).counters.get(tenant, 0.0)


async def test_a_request_past_its_estimate_is_charged_while_it_runs(replica, queue_config: QueueConfig) -> None:
    """A reply the gateway cannot watch (not streamed) that runs far past the 10 tokens its grant charged:
    the replica reports the engine's count, and the queue charges the tenant while it runs."""
    body = {"model": TINY_MODEL_NAME, "prompt": "x", "max_tokens": 4000, "ignore_eos": True}
    queue, tenant = _queue(), f"long-{uuid.uuid4().hex[:6]}"
    (grant,) = (await queue.enqueue(TicketSpec("t-long", tenant, "interactive", 10))).grants
    at_grant = await _counter(queue, "interactive", tenant)  # lifted to the band's virtual time, plus 10
    replies = replica.options(stream=True).generate.remote("completion", body, granted_replica=grant.replica_id,
                                                           ticket_id="t-long", charged=10)
    header = asyncio.ensure_future(replies.__anext__())
    deadline = time.monotonic() + 60
    while (charged := await _counter(queue, "interactive", tenant)) < at_grant + 50:
        assert time.monotonic() < deadline and not header.done(), "no progress was charged while it ran"
        await asyncio.sleep(0.05)
    replies.cancel()
    served = await replica.served.remote("t-long", 5.0, granted_replica=grant.replica_id)
    assert served is not None and served >= charged - at_grant + 10  # never charged past what the engine did
    header.cancel()
    await queue.complete("t-long", served)
    assert await _counter(queue, "interactive", tenant) == at_grant - 10 + served  # charged once, what it served
