"""Event-loop lag: how late the loop wakes a task that asked to sleep. A loop starved of CPU, or blocked by a
long callback, shows here before it shows anywhere else. The gateway exports it as a metric; the benchmark's
load client records its own, so a run can tell when the host, not the system under test, was the limit."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable


class LoopLagMonitor:
    """Sleeps ``period_s`` over and over on the running loop and passes each oversleep (seconds) to ``observe``."""

    def __init__(self, observe: Callable[[float], None], period_s: float = 0.05,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._observe, self._period_s, self._clock = observe, period_s, clock
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start sampling on the running loop (once)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop sampling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            asked = self._clock()
            await asyncio.sleep(self._period_s)
            self._observe(max(0.0, self._clock() - asked - self._period_s))
