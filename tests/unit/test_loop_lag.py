"""The loop-lag monitor reports how late the loop woke it: a blocking call on the loop shows as lag."""

from __future__ import annotations

import asyncio
import time

from fleet.loop_lag import LoopLagMonitor


async def test_a_blocked_loop_shows_as_lag_and_an_idle_one_does_not() -> None:
    lags: list[float] = []
    monitor = LoopLagMonitor(lags.append, period_s=0.01)
    monitor.start()
    while len(lags) < 3:
        await asyncio.sleep(0.01)
    assert max(lags) < 0.1  # idle: woken about on time (generous for a loaded CI machine)
    seen = len(lags)
    time.sleep(0.3)  # a blocking call on the loop
    while len(lags) == seen:
        await asyncio.sleep(0.01)
    await monitor.stop()
    assert lags[seen] >= 0.25
    assert monitor._task is None
