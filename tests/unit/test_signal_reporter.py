"""A replica's signal reports: coalesced to one write per interval, written only on change, a heartbeat
while idle, arrivals named once (again after a failed write), running requests' progress past their charge
at most once per progress interval; and the request tracker's unstarted count and progress."""

from __future__ import annotations

import asyncio

import pytest

from fleet.signal_reporter import SignalReporter
from policies.types import EngineSignals
from replicas.engine_signals import RequestTracker


class FakeQueue:
    def __init__(self) -> None:
        self.reports: list[tuple[EngineSignals, list[str]]] = []
        self.progress: list[list[tuple[str, int]]] = []
        self.fail = False
        self.written = asyncio.Event()

    async def report_signals(self, replica_id: str, signals: EngineSignals, received: list[str],
                             progress: list[tuple[str, int]] = ()) -> list:
        if self.fail:
            raise ConnectionError("redis away")
        self.reports.append((signals, list(received)))
        self.progress.append(list(progress))
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
    assert tracker.unstarted()[0] == 3 and tracker.received == 3
    tracker.mark_started([f"chatcmpl-{a}", f"cmpl-{b}-0", "someone-else"])  # vLLM's ids carry the key
    assert tracker.unstarted()[0] == 1
    tracker.leave(c)
    tracker.leave(a)
    assert tracker.unstarted()[0] == 0 and tracker.received == 3


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


async def test_progress_is_read_at_most_once_per_interval_and_written_even_without_a_change(setup) -> None:
    _, queue, clock, state = setup
    reads: list[float] = []
    past = {"now": [("t1", 300)]}

    def read_progress() -> list[tuple[str, int]]:
        reads.append(clock.now)
        return past["now"]

    reporter = SignalReporter(queue, "r1", lambda: state["signals"], interval_s=0.05, heartbeat_s=5.0, clock=clock,
                              sleep=clock.sleep, read_progress=read_progress, progress_interval_s=1.0)
    await reporter.report()
    assert queue.progress == [[("t1", 300)]]
    past["now"] = [("t1", 450)]
    await clock.advance(0.5)
    await reporter.report()  # signals unchanged, progress not due: nothing written, nothing read
    assert len(queue.reports) == 1 and len(reads) == 1
    await clock.advance(0.5)
    await reporter.report()  # due: written though the signals did not change
    assert queue.progress[-1] == [("t1", 450)] and len(queue.reports) == 2


async def test_progress_of_a_failed_write_goes_with_the_next(setup) -> None:
    _, queue, clock, state = setup
    past = {"now": [("t1", 300)]}
    reporter = SignalReporter(queue, "r1", lambda: state["signals"], interval_s=0.05, heartbeat_s=5.0, clock=clock,
                              sleep=clock.sleep, read_progress=lambda: past["now"], progress_interval_s=1.0)
    queue.fail = True
    with pytest.raises(ConnectionError):
        await reporter.report()
    queue.fail = False
    past["now"] = []
    await clock.advance(0.1)
    await reporter.report()  # the progress it read is sent, though the next read is not due yet
    assert queue.progress == [[("t1", 300)]]
    queue.fail = True  # Redis away for a while: each ticket's latest count is kept, once
    for served in (500, 650):
        past["now"] = [("t1", served), ("t2", served // 2)]
        await clock.advance(1.0)
        with pytest.raises(ConnectionError):
            await reporter.report()
    queue.fail = False
    past["now"] = []
    await clock.advance(1.0)
    await reporter.report()
    assert queue.progress[-1] == [("t1", 650), ("t2", 325)]


def test_tracker_reports_granted_requests_past_their_charge_once_per_rise() -> None:
    tracker = RequestTracker()
    granted = tracker.enter(20, ticket_id="t1", charged=150)
    ungranted = tracker.enter(20)  # no grant (no queue): nothing to charge
    assert tracker.progress({granted: 100, ungranted: 900}) == []  # within its estimate
    assert tracker.progress({granted: 400}) == [("t1", 400)]
    assert tracker.progress({granted: 400}) == []  # charged that much now
    assert tracker.progress({granted: 390}) == []  # never less
    assert tracker.progress({granted: 520, "fgr-unknown": 10**6}) == [("t1", 520)]
    tracker.leave(granted)
    assert tracker.progress({granted: 900}) == []


class _State:
    """What vllm_served reads of one of vLLM's RequestStates."""

    def __init__(self, external_req_id: str, request_id: str, prompt_len: int, output: int, parent=None) -> None:
        self.external_req_id, self.request_id, self.prompt_len, self.parent_req = (
            external_req_id, request_id, prompt_len, parent)
        self.detokenizer = type("Detokenizer", (), {"num_output_tokens": lambda _self: output})()
        self.stats = None


def test_served_counts_a_shared_prompt_once_and_each_prompt_of_a_batch() -> None:
    from types import SimpleNamespace

    from replicas.engine_signals import vllm_served

    tracker = RequestTracker()
    n_key, batch_key, other = tracker.enter(), tracker.enter(), "cmpl-not-ours"
    parent = SimpleNamespace(request_id=f"chatcmpl-{n_key}")
    states = [
        _State(f"chatcmpl-{n_key}", f"0_chatcmpl-{n_key}", 30, 12, parent),  # n=2: one prompt, two outputs
        _State(f"chatcmpl-{n_key}", f"1_chatcmpl-{n_key}", 30, 9, parent),
        _State(f"cmpl-{batch_key}-0", f"cmpl-{batch_key}-0", 20, 5),  # a batch of two prompts
        _State(f"cmpl-{batch_key}-1", f"cmpl-{batch_key}-1", 25, 7),
        _State(other, other, 99, 99),
    ]
    engine = SimpleNamespace(output_processor=SimpleNamespace(request_states={s.request_id: s for s in states}))
    assert vllm_served(tracker, engine) == {n_key: 30 + 12 + 9, batch_key: 20 + 5 + 25 + 7}


def test_each_engine_request_of_a_grant_counts_until_it_starts() -> None:
    """n = 4 with one sequence started still has three waiting in the engine; a batch of two prompts, both
    waiting, is two; a request the engine does not hold yet (in transit) counts once, by the gateway's count."""
    from types import SimpleNamespace

    from replicas.engine_signals import vllm_signals

    tracker = RequestTracker()
    tracker.prefill_chunk = 64
    fanned, batch, in_transit = tracker.enter(30), tracker.enter(200), tracker.enter(500)

    def state(engine_id: str, prompt_len: int, prefilling: bool) -> SimpleNamespace:
        return SimpleNamespace(external_req_id=engine_id, request_id=engine_id, prompt_len=prompt_len,
                               is_prefilling=prefilling)

    states = [state(f"{i}_chatcmpl-{fanned}", 30, i > 0) for i in range(4)]
    states += [state(f"cmpl-{batch}-{i}", 100, True) for i in range(2)]
    engine = SimpleNamespace(output_processor=SimpleNamespace(request_states={s.request_id: s for s in states}))
    signals = vllm_signals(tracker, engine, None)
    assert signals.unstarted == 3 + 2 + 1
    assert signals.unstarted_tokens == 3 * 30 + 2 * 64 + 64  # each up to the prefill chunk
