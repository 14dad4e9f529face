"""Fewer, larger stream messages: a replica's SSE lines sent at most once per interval, as Ray Serve LLM does.

Every message a replica yields costs the host a Ray object on each hop (replica to gateway, gateway to the Serve
proxy), about a millisecond of CPU each on these machines, whatever its size. A stream of one message per token
therefore costs the host as much per token as a small engine step. Holding the lines that arrive within one
interval and sending them as one message (several SSE events in one string) cuts that cost by the tokens per
interval. A line that arrives after a quiet interval goes at once, so the first token is never held (a chat
stream's role-only first chunk opens no interval); the end of the stream is never held either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

logger = logging.getLogger(__name__)

Item = TypeVar("Item")
_END = object()


def carries_output(line: str) -> bool:
    """False for a chat stream's role-only chunk (vLLM's first), which must not hold back the first token."""
    return '"role":' not in line


class _ReadAhead:
    """Reads ``items`` in a task of its own, so that the reader can wait for more with a deadline without
    cancelling the read."""

    def __init__(self, items: AsyncIterator[Item]) -> None:
        self.arrived: asyncio.Queue = asyncio.Queue()
        self.finished = asyncio.Event()
        self._task = asyncio.ensure_future(self._read(items))

    async def _read(self, items: AsyncIterator[Item]) -> None:
        try:
            async for item in items:
                self.arrived.put_nowait(item)
        except Exception as exc:  # raised again to the reader, after the items before it
            self.arrived.put_nowait(exc)
        finally:
            self.arrived.put_nowait(_END)
            self.finished.set()

    async def hold(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the items end meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.finished.wait(), seconds)

    def take(self, first: object) -> list[object]:
        """``first`` and every item arrived since."""
        taken = [first]
        while not self.arrived.empty():
            taken.append(self.arrived.get_nowait())
        return taken

    async def close(self) -> None:
        """Stop reading (the caller went away): the read of ``items`` is cancelled."""
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def _messages(taken: list[object]) -> tuple[list[object], BaseException | None, bool]:
    """The messages for items taken together (consecutive strings joined, anything else alone), the error
    that ended them, and whether they ended."""
    messages: list[object] = []
    held: list[str] = []
    for item in taken:
        if isinstance(item, str):
            held.append(item)
            continue
        if held:
            messages.append("".join(held))
            held = []
        if item is _END or isinstance(item, Exception):
            return messages, item if isinstance(item, Exception) else None, True
        messages.append(item)
    return messages + (["".join(held)] if held else []), None, False


async def batched_lines(items: AsyncIterator[Item], interval_s: float,
                        clock: Callable[[], float] = time.monotonic,
                        on_cut: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[Item | str]:
    """``items`` with its strings joined into at most one message per ``interval_s`` (0: each as it comes);
    an interval opens when a message that :func:`carries_output` is sent. Anything but a string (a reply's
    header) flushes what is held and passes at once. Closing this generator (the caller cancelled) cancels
    the read of ``items``, as iterating ``items`` directly would; ``on_cut`` runs first, while what ``items``
    reads from is still untouched by the cancel (the replica counts and aborts the engine request there)."""
    if interval_s <= 0 and on_cut is None:
        async for item in items:
            yield item
        return
    ahead = _ReadAhead(items)
    last_flush: float | None = None
    ended = False
    try:
        while True:
            first = await ahead.arrived.get()
            wait = 0.0 if last_flush is None or not isinstance(first, str) else last_flush + interval_s - clock()
            if wait > 0:
                await ahead.hold(wait)  # until the interval closes, or the items end
            messages, error, ended = _messages(ahead.take(first) if interval_s > 0 else [first])
            for message in messages:
                yield message
                if isinstance(message, str) and carries_output(message):
                    last_flush = clock()
            if error is not None:
                raise error
            if ended:
                return
    finally:
        try:
            if not ended and on_cut is not None:
                await on_cut()
        except Exception as exc:  # the cancel goes on; the reply is then charged by what it read
            logger.warning("a cut stream's count failed: %s", type(exc).__name__)
        finally:
            await ahead.close()
