"""A lock handed to the smallest waiter next, so a small job never waits behind a queue of large ones: at
most behind the one job that holds it."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator


class SmallestFirstLock:
    """One holder at a time; when it releases, the waiter of the smallest ``size`` goes next (ties: first come)."""

    def __init__(self) -> None:
        self._held = False
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    @contextlib.asynccontextmanager
    async def turn(self, size: int) -> AsyncIterator[None]:
        """Hold the lock for a job of ``size``."""
        if self._held:
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (size, next(self._arrivals), ready))
            try:
                await ready
            except asyncio.CancelledError:
                if ready.done() and not ready.cancelled():  # handed the lock as it was cancelled: pass it on
                    self._release()
                raise
        self._held = True
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            _, _, ready = heapq.heappop(self._waiting)
            if not ready.done():
                ready.set_result(None)  # the lock passes straight to it: still held
                return
        self._held = False
