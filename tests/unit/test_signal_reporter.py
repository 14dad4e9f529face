"""A replica's signal reports: coalesced to one write per interval, written only on change, a heartbeat
while idle, arrivals named once (again after a failed write); and the request tracker's unstarted count."""

from __future__ import annotations

import asyncio

import pytest

from fleet.signal_reporter import SignalReporter
from policies.types import EngineSignals
from replicas.engine_signals import RequestTracker


class FakeQueue:
    def __init__(self) -> None:
        self.reports: list[tuple[EngineSignals, list[str]]] = []
        self.fail = False
        self.written = asyncio.Event()

    async def report_signals(self, replica_id: str, signals: EngineSignals, received: list[str]) -> list:
        if self.fail:
            raise ConnectionError("redis away")
        self.reports.append((signals, list(received)))
        self.written.set()
        return []


class Clock:
    """Time moves only when the reporter sleeps; a sleep returns once the test lets time pass."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []
        self._waiting: list[tuple[float, asyncio.Future]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((self.now + seconds, future))
        await future

    async def advance(self, seconds: float) -> None:
        self.now += seconds
        for due, future in list(self._waiting):
            if due <= self.now and not future.done():
                future.set_result(None)
        self._waiting = [(due, f) for due, f in self._waiting if not f.done()]
        for _ in range(5):  # let the reporter run what that released
            await asyncio.sleep(0)


async def _written(queue: FakeQueue, count: int) -> None:
    while len(queue.reports) < count:
        queue.written.clear()
        await asyncio.wait_for(queue.written.wait(), 2)


@pytest.fixture
def setup():
    clock, queue = Clock(), FakeQueue()
    state = {"signals": EngineSignals()}
    reporter = SignalReporter(queue, "r1", lambda: state["signals"], interval_s=0.05, heartbeat_s=0.5,
                              clock=clock, sleep=clock.sleep)
    return reporter, queue, clock, state


async def test_first_report_at_once_then_changes_coalesced_per_interval(setup) -> None:
    reporter, queue, clock, state = setup
    reporter.start()
    await _written(queue, 1)  # at start: the heartbeat is due
    for unstarted in (1, 2, 3):  # three engine steps inside one interval
        state["signals"] = EngineSignals(unstarted=unstarted)
        reporter.notify()
        await asyncio.sleep(0)
    assert len(queue.reports) == 1
    await clock.advance(0.05)
    await _written(queue, 2)
    assert queue.reports[-1][0].unstarted == 3 and len(queue.reports) == 2
    reporter.stop()


async def test_unchanged_signals_are_not_rewritten_until_the_heartbeat(setup) -> None:
    reporter, queue, clock, state = setup
    reporter.start()
    await _written(queue, 1)
    reporter.notify()  # a step that changed nothing (KV usage within a hundredth)
    state["signals"] = EngineSignals(kv_usage=0.004)
    await clock.advance(0.05)
    assert len(queue.reports) == 1
    await clock.advance(0.5)  # idle engine: the heartbeat repeats the report
    await _written(queue, 2)
    reporter.stop()


async def test_arrivals_are_named_once_and_again_after_a_failed_write(setup) -> None:
    reporter, queue, clock, state = setup
    await reporter.report()
    reporter.received("t1")
    reporter.received("t2")
    queue.fail = True
    with pytest.raises(ConnectionError):
        await reporter.report()
    queue.fail = False
    reporter.received("t3")
    await reporter.report()
    assert queue.reports[-1][1] == ["t1", "t2", "t3"]
    await clock.advance(0.1)
    state["signals"] = EngineSignals(unstarted=1)
    await reporter.report()
    assert queue.reports[-1][1] == []


def test_tracker_counts_requests_until_their_first_token() -> None:
    tracker = RequestTracker()
    a, b, c = tracker.enter(), tracker.enter(), tracker.enter()
    assert tracker.unstarted == 3 and tracker.received == 3
    tracker.mark_started([f"chatcmpl-{a}", f"cmpl-{b}-0", "someone-else"])  # vLLM's ids carry the key
    assert tracker.unstarted == 1
    tracker.leave(c)
    tracker.leave(a)
    assert tracker.unstarted == 0 and tracker.received == 3


class _Registration:
    def __init__(self) -> None:
        self.stopped = self.deregistered = 0

    def stop(self) -> None:
        self.stopped += 1

    async def deregister(self) -> None:
        self.deregistered += 1


async def test_a_replica_leaving_on_a_running_loop_deregisters_once() -> None:
    from replicas.base import ReplicaBase

    replica = ReplicaBase()
    replica._registration = registration = _Registration()
    leaving = replica._leave_fleet()
    assert leaving is not None and replica._leave_fleet() is None  # Serve's call, then the GC's: once
    await leaving
    assert (registration.stopped, registration.deregistered) == (1, 1)


def test_a_replica_collected_without_a_loop_lets_its_lease_lapse() -> None:
    from replicas.base import ReplicaBase

    replica = ReplicaBase()
    replica._registration = registration = _Registration()
    assert replica._leave_fleet() is None and registration.stopped == 1 and registration.deregistered == 0
