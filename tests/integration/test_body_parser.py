"""The gateway's body-parsing child process (gateway/body_parser.py), started for real: a dense body is
parsed there to the same result, or the same error, as in the gateway's own process, while the event loop
keeps running; the child's death or a caller that leaves mid-exchange loses no body."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio

from gateway.body_parser import BodyParser
from gateway.errors import GatewayError
from gateway.request_parsing import ClientOptions, parse_request, preload_protocol_models

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _chat(parts: int, **fields: object) -> bytes:
    """A chat of one message of ``parts`` text parts: pydantic holds the GIL ~13 µs a part validating it."""
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}] * parts}],
                       **fields}).encode()


@pytest_asyncio.fixture(loop_scope="function")
async def parser() -> AsyncIterator[BodyParser]:
    preload_protocol_models()  # as the gateway does before it serves
    parser = BodyParser(dense_values=4096)
    await parser.start()
    await asyncio.wait_for(parser._ready.wait(), timeout=120)
    yield parser
    await parser.close()


async def _longest_stall(work: Callable[[], object]) -> tuple[float, object]:
    """The longest the running loop went without running a task while ``work`` was awaited, and its result."""
    stalls: list[float] = []
    finished = asyncio.Event()

    async def tick() -> None:
        while not finished.is_set():
            started = time.perf_counter()
            await asyncio.sleep(0)
            stalls.append(time.perf_counter() - started)

    ticker = asyncio.create_task(tick())
    try:
        result = await work()
    except GatewayError as exc:
        result = exc
    finished.set()
    await ticker
    return max(stalls), result


async def test_a_dense_body_is_parsed_in_the_child_to_the_same_request(parser: BodyParser) -> None:
    raw = _chat(60_000, max_tokens=7, n=2)
    stall, parsed = await _longest_stall(lambda: parser.parse(raw, "chat"))
    assert parsed == parse_request(raw, "chat")
    # in a thread of this process, validating it holds the GIL (and so this loop) for about 0.8 s
    assert stall < 0.25, stall


async def test_a_dense_invalid_body_gets_the_same_error(parser: BodyParser) -> None:
    options = ClientOptions(template_options=frozenset({"enable_thinking"}))
    for raw in (_chat(20_000, temperature="hot"), _chat(20_000, chat_template_kwargs={"tools_only": 1}),
                _chat(20_000)[:-1]):
        with pytest.raises(GatewayError) as here:
            parse_request(raw, "chat", options)
        with pytest.raises(GatewayError) as there:
            await parser.parse(raw, "chat", options)
        assert type(there.value) is type(here.value)
        assert (there.value.message, there.value.param) == (here.value.message, here.value.param)


async def test_a_dead_child_loses_no_body_and_is_restarted(parser: BodyParser) -> None:
    raw = _chat(20_000, max_tokens=3)
    parser._worker.kill()
    await parser._worker.wait()
    assert (await parser.parse(raw, "chat")).max_tokens == 3  # parsed here while the child restarts
    await asyncio.wait_for(parser._ready.wait(), timeout=120)
    assert (await parser.parse(raw, "chat")).max_tokens == 3


async def test_a_caller_that_leaves_mid_exchange_leaves_the_pipe_in_step(parser: BodyParser) -> None:
    leaving = asyncio.create_task(parser.parse(_chat(60_000, max_tokens=1), "chat"))
    await asyncio.sleep(0.05)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert (await parser.parse(_chat(20_000, max_tokens=9), "chat")).max_tokens == 9


async def test_with_no_dense_limit_no_child_is_started() -> None:
    parser = BodyParser(dense_values=0)
    await parser.start()
    assert parser._worker is None
    assert (await parser.parse(_chat(20_000, max_tokens=4), "chat")).max_tokens == 4
