"""Replicas that Serve is draining, kept out of the global queue until they are gone.

A replica Serve stops first drains: it serves the streams it holds, for up to its pool's
``graceful_shutdown_timeout_s``, and takes no new calls. Its heartbeat goes on meanwhile, so the queue would
keep granting to it. The first gateway whose grant finds it gone holds it out for ``unreachable_hold_s``
(gateway/admission.py). This keeps renewing that hold, every half hold, for as long as this process's
routers no longer list the replica, and at most ``max_s``, so a long drain costs one requeue in all instead of
one per hold. A replica the routers list again (never a draining one) is let back at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import redis

logger = logging.getLogger(__name__)


class LeavingReplicas:
    """Holds out the replicas this gateway found leaving, while they stay unroutable."""

    def __init__(self, hold: Callable[[str, int], Awaitable[object]], routable: Callable[[str], bool],
                 hold_s: float, max_s: float, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._hold, self._routable, self._hold_s, self._max_s = hold, routable, hold_s, max_s
        self._sleep, self._clock = sleep, clock
        self._keepers: dict[str, asyncio.Task[None]] = {}

    def watch(self, replica_id: str) -> None:
        """``replica_id`` was just held out: renew its hold while it stays unroutable (one keeper a replica)."""
        if self._hold_s <= 0 or replica_id in self._keepers:
            return
        task = asyncio.get_running_loop().create_task(self._keep(replica_id))
        self._keepers[replica_id] = task
        task.add_done_callback(lambda _: self._keepers.pop(replica_id, None))

    async def _keep(self, replica_id: str) -> None:
        until = self._clock() + self._max_s
        while True:
            await self._sleep(self._hold_s / 2)
            if self._routable(replica_id) or self._clock() >= until:
                return
            try:
                await self._hold(replica_id, int(self._hold_s * 1000))
            except redis.RedisError as exc:  # the hold runs out, and the next requeue holds it again
                logger.warning("could not renew the hold on a departing replica: %s", type(exc).__name__)
                return
