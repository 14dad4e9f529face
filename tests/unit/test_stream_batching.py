"""A replica's stream lines, batched: the first goes at once, lines within an interval go as one message, the
end is never held, errors and cancellation pass through as they would unbatched."""

from __future__ import annotations

import asyncio

import pytest

from gateway.relay import sse_events
from replicas.stream_batching import batched_lines
from tests.support.clock import ManualClock


class Source:
    """An async iterator the test feeds; records whether it was closed (the engine request aborted)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.closed = False

    async def lines(self):
        try:
            while (item := await self.queue.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.closed = True


async def _next(stream) -> object:
    return await asyncio.wait_for(stream.__anext__(), 5)


async def _after_a_first_line(interval_s: float = 3600, clock: ManualClock | None = None):
    """A batched stream whose first line, "a", has gone (at once: nothing was flushed before); its source."""
    source = Source()
    stream = batched_lines(source.lines(), interval_s=interval_s, clock=clock or ManualClock(0.0))
    source.queue.put_nowait("a")
    assert await _next(stream) == "a"
    return source, stream


async def test_first_line_at_once_then_one_message_per_interval_and_the_end_not_held() -> None:
    source, clock = Source(), ManualClock(0.0)
    stream = batched_lines(source.lines(), interval_s=3600, clock=clock)
    source.queue.put_nowait({"status": 200})
    assert await _next(stream) == {"status": 200}  # the reply's header passes as it is
    source.queue.put_nowait("data: 1\n\n")
    assert await _next(stream) == "data: 1\n\n"  # nothing was flushed before: at once
    for line in ("data: 2\n\n", "data: 3\n\n"):
        source.queue.put_nowait(line)
    pending = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.05)
    assert not pending.done()  # held: the interval since the last flush has not passed
    source.queue.put_nowait(None)  # the stream ends: what is held goes now, not at the interval's end
    assert await asyncio.wait_for(pending, 5) == "data: 2\n\ndata: 3\n\n"
    with pytest.raises(StopAsyncIteration):
        await _next(stream)


async def test_a_line_after_a_quiet_interval_goes_at_once() -> None:
    clock = ManualClock(0.0)
    source, stream = await _after_a_first_line(interval_s=0.5, clock=clock)
    clock.now = 0.6
    source.queue.put_nowait("b")
    assert await _next(stream) == "b"
    source.queue.put_nowait(None)
    with pytest.raises(StopAsyncIteration):
        await _next(stream)


async def test_an_error_comes_after_the_lines_before_it() -> None:
    source, stream = await _after_a_first_line()
    source.queue.put_nowait("b")
    source.queue.put_nowait(RuntimeError("engine died"))
    assert await _next(stream) == "b"
    with pytest.raises(RuntimeError, match="engine died"):
        await _next(stream)


async def test_closing_the_batched_stream_closes_its_source() -> None:
    source, stream = await _after_a_first_line()
    waiting = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.01)
    waiting.cancel()  # the caller (Ray Serve, the client gone) cancels the call
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert source.closed


@pytest.mark.parametrize("interval_s", [3600, 0])
async def test_a_cut_stream_runs_on_cut_before_its_source_sees_the_cancel(interval_s: float) -> None:
    # the replica reads its engine's count for the request there: after the cancel, vLLM has aborted it
    source, seen_open = Source(), []
    async def cut() -> None:
        seen_open.append(not source.closed)

    stream = batched_lines(source.lines(), interval_s=interval_s, clock=ManualClock(0.0), on_cut=cut)
    source.queue.put_nowait("a")
    assert await _next(stream) == "a"
    waiting = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert seen_open == [True] and source.closed


async def test_a_failing_on_cut_still_closes_the_source() -> None:
    source = Source()

    async def broken() -> None:
        raise RuntimeError("engine gone")

    stream = batched_lines(source.lines(), interval_s=3600, clock=ManualClock(0.0), on_cut=broken)
    source.queue.put_nowait("a")
    assert await _next(stream) == "a"
    waiting = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):  # the cancel, not the hook's error
        await waiting
    assert source.closed


async def test_a_stream_that_ends_is_not_cut() -> None:
    source, cuts = Source(), []
    for item in ("a", "b", None):
        source.queue.put_nowait(item)
    async def cut() -> None:
        cuts.append(1)

    stream = batched_lines(source.lines(), interval_s=0, on_cut=cut)
    assert [item async for item in stream] == ["a", "b"] and cuts == []  # no interval: each as it comes


async def test_no_interval_passes_every_item_as_it_comes() -> None:
    source = Source()
    for item in ("a", "b", None):
        source.queue.put_nowait(item)
    assert [item async for item in batched_lines(source.lines(), interval_s=0)] == ["a", "b"]


def test_a_joined_message_splits_back_into_its_events() -> None:
    assert sse_events('data: {"a":1}\n\ndata: [DONE]\n\n') == ['data: {"a":1}\n\n', "data: [DONE]\n\n"]
    assert sse_events("data: x\n\n") == ["data: x\n\n"]


async def test_a_chat_streams_role_chunk_does_not_hold_back_its_first_token() -> None:
    source = Source()
    stream = batched_lines(source.lines(), interval_s=3600, clock=ManualClock(0.0))
    source.queue.put_nowait('data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n')
    assert "role" in await _next(stream)
    source.queue.put_nowait('data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n')
    assert "Hi" in await _next(stream)  # at once: the role chunk opened no interval
