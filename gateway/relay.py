"""Relaying a replica's stream to the client as server-sent events, settling when it ends however it ends."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from ray.exceptions import TaskCancelledError
from ray.serve.handle import DeploymentResponseGenerator
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.accounting import StreamUsage, run_apart
from gateway.errors import error_body

logger = logging.getLogger(__name__)


async def relay_lines(replies: DeploymentResponseGenerator, usage: StreamUsage) -> AsyncIterator[str]:
    """The replica's SSE lines as the client sees them; a replica failure ends with an error event and [DONE].

    If the client goes away, Starlette cancels this generator; cancelling ``replies`` then propagates to
    the replica, which aborts the engine request.
    """
    try:
        async for message in replies:
            forwarded = [kept for line in sse_events(message) if (kept := usage.observe(line)) is not None]
            if forwarded:
                yield "".join(forwarded)
    except Exception as exc:  # the replica died or failed mid-stream
        logger.warning("stream from replica failed: %s", type(exc).__name__)
        usage.finished = True  # ended here: there is no replica left to ask what it served
        error = error_body("The model replica failed during the stream.", "service_unavailable", "replica_failed")
        yield f"data: {json.dumps(error)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        replies.cancel()


def sse_events(message: str) -> list[str]:
    """The SSE events of one replica message (a replica joins the events of one batching interval into one
    message: replicas/stream_batching.py), each with its blank-line terminator."""
    return [event + "\n\n" for event in message.split("\n\n") if event.strip()]


class SettlingStreamingResponse(StreamingResponse):
    """A streamed response that runs ``on_exit`` when it is done with, even if it never started sending
    (the client gone before the first byte, or the ASGI send failing first), and to its end even if the
    request is cancelled again meanwhile (it runs as a task of its own, shielded)."""

    def __init__(self, content: AsyncIterator[str], on_exit: Callable[[], Awaitable[None]],
                 headers: dict[str, str]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._on_exit = on_exit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except* TaskCancelledError:  # Ray's receive proxy when the client left mid-stream: nobody to answer
            logger.debug("the client left mid-stream")
        finally:
            await run_apart(self._on_exit())
