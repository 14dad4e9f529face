"""A stream whose client leaves ends quietly and settles: Ray's receive proxy raises TaskCancelledError then,
which is a client gone, not a gateway error (it was logged as one, with a traceback, for every such client)."""

from __future__ import annotations

import asyncio

from ray.exceptions import TaskCancelledError

from gateway.relay import SettlingStreamingResponse


async def test_a_client_gone_mid_stream_is_no_error_and_the_request_settles() -> None:
    settled, sent = [], []

    async def lines():
        yield "data: 1\n\n"

    async def receive():
        raise TaskCancelledError()  # what Ray Serve's receive proxy raises when the client disconnected

    async def send(message):
        sent.append(message)

    async def on_exit() -> None:
        settled.append(True)

    response = SettlingStreamingResponse(lines(), on_exit, headers={})
    await response({"type": "http", "asgi": {"spec_version": "2.0"}}, receive, send)
    assert settled == [True]


async def test_other_failures_still_raise_and_still_settle() -> None:
    import pytest

    settled = []

    async def lines():
        yield "data: 1\n\n"

    async def receive():
        await asyncio.Event().wait()  # the client stays

    async def send(message):
        raise RuntimeError("the send broke")

    async def on_exit() -> None:
        settled.append(True)

    with pytest.raises(BaseException) as caught:
        await SettlingStreamingResponse(lines(), on_exit, headers={})({"type": "http", "asgi": {"spec_version": "2.0"}},
                                                                     receive, send)
    assert "the send broke" in repr(caught.value) and settled == [True]


async def test_a_request_cancelled_again_while_it_settles_still_settles() -> None:
    releasing, released, settled = asyncio.Event(), asyncio.Event(), []

    async def lines():
        yield "data: 1\n\n"

    async def receive():
        raise TaskCancelledError()

    async def send(message):
        pass

    async def on_exit() -> None:
        releasing.set()
        await released.wait()  # the release's Redis call
        settled.append(True)

    request = asyncio.create_task(SettlingStreamingResponse(lines(), on_exit, headers={})(
        {"type": "http", "asgi": {"spec_version": "2.0"}}, receive, send))
    await releasing.wait()
    request.cancel()  # cancelled again while it settles
    try:
        await request
    except asyncio.CancelledError:
        pass
    released.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert settled == [True]
