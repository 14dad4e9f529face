"""A replica's engine signals, reported to the global queue: the gate's view of that replica.

The engine tells the reporter when it stepped (:meth:`SignalReporter.notify`, cheap: it only sets a flag,
so vLLM's stat logger hook stays fast on the replica's event loop); the reporter's own task reads the
signals and writes them, at most once per ``interval_s`` (the first change after a quiet spell at once,
the rest coalesced), and only when they changed or granted tickets arrived. An idle engine steps no more,
so a heartbeat repeats the last report every ``heartbeat_s``, and the queue keeps trusting it. Each report
also names the granted tickets that arrived since the last one, which ends their in-flight credit, and, at
most every ``progress_interval_s``, the running requests that have served more than their tenants were
charged (the queue tops the charge up: policies/fairness.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from fleet.outage_log import OutageLog
from fleet.queue import GlobalQueue
from policies.types import EngineSignals

Progress = list[tuple[str, int]]  # (ticket, tokens its engine has served so far)

logger = logging.getLogger(__name__)


def _digest(signals: EngineSignals) -> tuple[int, int, int, int, float]:
    """What counts as a change worth a report (KV usage moves a little every step)."""
    return (signals.unstarted, signals.unstarted_tokens, signals.running, signals.waiting,
            round(signals.kv_usage, 2))


class SignalReporter:
    """Reports one replica's engine signals to the global queue, coalesced, with a heartbeat."""

    def __init__(self, queue: GlobalQueue, replica_id: str, read: Callable[[], EngineSignals], interval_s: float,
                 heartbeat_s: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 read_progress: Callable[[], Progress] | None = None, progress_interval_s: float = 1.0) -> None:
        self._queue, self._replica_id, self._read = queue, replica_id, read
        self._interval_s, self._heartbeat_s = interval_s, heartbeat_s
        self._clock, self._sleep = clock, sleep
        self._read_progress, self._progress_interval_s = read_progress, progress_interval_s
        self._progress_read = float("-inf")
        self._unsent_progress: dict[str, int] = {}  # read, but its report failed: sent with the next one
        self._changed = asyncio.Event()
        self._arrived: list[str] = []
        self._last: tuple | None = None
        self._last_write = float("-inf")
        self._task: asyncio.Task | None = None
        self.reports = 0
        self._outage = OutageLog(logger, "the engine signal report", clock=clock)

    def received(self, ticket_id: str) -> None:
        """A granted ticket arrived at this replica (named in the next report; until then the queue counts it
        in flight, so the pending work it sees is the same either way, and arrival alone needs no write)."""
        self._arrived.append(ticket_id)

    def notify(self) -> None:
        """The engine stepped: the signals may have changed."""
        self._changed.set()

    def start(self) -> None:
        """Report now, then on every change and heartbeat (needs a running event loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        """Stop reporting; the queue's view of this replica goes stale, then its lease lapses."""
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await self._until_change_or_heartbeat()
            wait = self._interval_s - (self._clock() - self._last_write)
            if wait > 0:
                await self._sleep(wait)
            self._changed.clear()
            try:
                await self.report()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis restarting: the signals go stale meanwhile, and the gate falls back
                self._outage.failed(exc)
                await self._sleep(self._heartbeat_s)
            else:
                self._outage.succeeded()

    async def _until_change_or_heartbeat(self) -> None:
        remaining = self._heartbeat_s - (self._clock() - self._last_write)
        if remaining <= 0 or self._changed.is_set():
            return
        changed = asyncio.ensure_future(self._changed.wait())
        timer = asyncio.ensure_future(self._sleep(remaining))
        try:
            await asyncio.wait({changed, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            timer.cancel()

    async def report(self) -> None:
        """Write the signals now if they changed, tickets arrived, progress is due, or the heartbeat is."""
        signals = self._read()
        due = self._clock() - self._last_write >= self._heartbeat_s
        unsent, self._unsent_progress = self._unsent_progress, {}
        for ticket_id, served in self._progress():  # a ticket's latest count supersedes an unsent one
            unsent[ticket_id] = max(served, unsent.get(ticket_id, 0))
        progress = list(unsent.items())
        if _digest(signals) == self._last and not self._arrived and not due and not progress:
            return
        arrived, self._arrived = self._arrived, []
        try:
            await self._queue.report_signals(self._replica_id, signals, arrived, progress=progress)
        except BaseException:
            self._arrived = arrived + self._arrived  # named again in the next report
            self._unsent_progress = unsent  # counts served so far: sent late, it charges the same
            raise
        self._last, self._last_write = _digest(signals), self._clock()
        self.reports += 1

    def _progress(self) -> Progress:
        if self._read_progress is None or self._clock() - self._progress_read < self._progress_interval_s:
            return []
        self._progress_read = self._clock()
        return self._read_progress()
