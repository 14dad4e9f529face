"""Where a request body is parsed, so that no body's JSON holds up the gateway's event loop.

``json.loads`` and pydantic hold the GIL for the whole of one call, so a worker thread does not keep the loop
(every other tenant's relayed streams, /health) running beside a dense body: measured here, a 2 MB chat of
60,000 content parts held it for 0.8 s in validation, 8 MB of small values for 0.35 s in ``json.loads``
alone. So a body that could hold more than ``dense_values`` JSON values (counted from its bytes: every value
after a container's first follows a comma) is parsed in a child process, one per gateway replica, started
with it. Smaller bodies are parsed as before: on the loop up to 64 KiB, then in a thread. Until the child is
ready, or while it is restarted after dying, dense bodies take the thread too: slower for everyone, never
refused. The child takes one body at a time, the smallest waiting first, so one tenant's 8 MB bodies delay
another's dense body by at most the one being parsed. Its throughput is one core's, as the threads' was (the
GIL): it moves the work off the loop, it does not add any.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import sys

from gateway.parse_worker import READY, REPLY_HEADER, REQUEST_HEADER
from gateway.request_parsing import ClientOptions, Endpoint, ParsedRequest, parse_request
from gateway.smallest_first import SmallestFirstLock

logger = logging.getLogger(__name__)

ON_LOOP_UP_TO_BYTES = 64 << 10  # parsing and validating a body this small takes well under a millisecond
BOUND_STEP_BYTES = 64 << 10


def values_bound(raw_body: bytes, stop_above: int | None = None) -> int:
    """At least as many as the JSON values ``raw_body`` holds (commas and brackets inside strings count too),
    counted in 64 KiB steps and given up once past ``stop_above``: a dense body is known from its first step."""
    total = 1
    for start in range(0, len(raw_body), BOUND_STEP_BYTES):
        end = start + BOUND_STEP_BYTES
        total += sum(raw_body.count(mark, start, end) for mark in (b",", b"{", b"["))
        if stop_above is not None and total > stop_above:
            break
    return total


class BodyParser:
    """Parses request bodies for one gateway replica; dense ones in its child process."""

    def __init__(self, dense_values: int) -> None:
        self._dense_values = dense_values  # 0: every body in this process
        self._worker: asyncio.subprocess.Process | None = None
        self._ready = asyncio.Event()
        self._turn = SmallestFirstLock()  # one body at a time through the child's pipe, the smallest first

    async def start(self) -> None:
        """Start the child (it becomes ready seconds later, after importing vLLM's request models)."""
        if self._dense_values <= 0 or self._worker is not None:
            return
        self._ready = asyncio.Event()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        self._worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.parse_worker", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env=env)
        asyncio.get_running_loop().create_task(self._await_ready(self._worker))

    async def _await_ready(self, worker: asyncio.subprocess.Process) -> None:
        assert worker.stdout is not None
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            if await worker.stdout.readexactly(len(READY)) == READY and worker is self._worker:
                self._ready.set()
                return
        logger.warning("the body-parsing process did not start; dense bodies are parsed in a thread")

    async def parse(self, raw_body: bytes, endpoint: Endpoint, options: ClientOptions = ClientOptions()) -> ParsedRequest:
        """:func:`gateway.request_parsing.parse_request` of ``raw_body``, wherever it holds the loop least."""
        if len(raw_body) <= ON_LOOP_UP_TO_BYTES:
            return parse_request(raw_body, endpoint, options)
        if (not self._dense_values or not self._ready.is_set()
                or values_bound(raw_body, stop_above=self._dense_values) <= self._dense_values):
            return await asyncio.to_thread(parse_request, raw_body, endpoint, options)
        # shielded: a client that leaves mid-exchange must not leave the pipe between a request and its answer
        exchange = asyncio.ensure_future(self._exchange(raw_body, endpoint, options))
        done, value = await asyncio.shield(exchange)
        if done is None:  # the child died: restarted for the next body, this one parsed here
            return await asyncio.to_thread(parse_request, raw_body, endpoint, options)
        if done:
            return value
        raise value

    async def _exchange(self, raw_body: bytes, endpoint: Endpoint,
                        options: ClientOptions) -> tuple[bool | None, object]:
        async with self._turn.turn(len(raw_body)):
            worker = self._worker
            if worker is None or worker.stdin is None or worker.stdout is None or not self._ready.is_set():
                return None, None
            meta = pickle.dumps((endpoint, options))
            try:
                worker.stdin.write(REQUEST_HEADER.pack(len(meta), len(raw_body)) + meta)
                worker.stdin.write(raw_body)
                await worker.stdin.drain()
                (size,) = REPLY_HEADER.unpack(await worker.stdout.readexactly(REPLY_HEADER.size))
                reply = await worker.stdout.readexactly(size)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                logger.warning("the body-parsing process died (%s); restarting it", type(exc).__name__)
                await self._restart()
                return None, None
        return pickle.loads(reply)

    async def _restart(self) -> None:
        await self.close()
        await self.start()

    async def close(self) -> None:
        """Stop the child: it exits when its input ends."""
        worker, self._worker = self._worker, None
        self._ready.clear()
        if worker is None:
            return
        if worker.stdin is not None:
            worker.stdin.close()
        try:
            await asyncio.wait_for(worker.wait(), timeout=5)
        except asyncio.TimeoutError:
            worker.kill()
            await worker.wait()
