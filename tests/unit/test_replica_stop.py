"""A vLLM replica's graceful stop: it leaves the queue's fleet before it stops its engine, whose shutdown
blocks the event loop for seconds (a lease that lapsed meanwhile read to the queue as a crash)."""

from __future__ import annotations

import asyncio

from replicas.deployment import VLLMReplica


class Recorder:
    """The replica's capacity registration and engine, writing down what was done to them, in order."""

    def __init__(self) -> None:
        self.done: list[str] = []

    def stop(self) -> None:
        self.done.append("heartbeat stopped")

    async def deregister(self) -> None:
        await asyncio.sleep(0)
        self.done.append("deregistered")

    def shutdown(self) -> None:
        self.done.append("engine stopped")


def _replica(recorder: Recorder) -> VLLMReplica:
    replica = VLLMReplica.__new__(VLLMReplica)  # no engine to start: only what the stop touches
    replica._reporter, replica._registration, replica._engine = None, recorder, recorder
    return replica


def test_under_serve_the_replica_deregisters_before_its_engine_stops() -> None:
    recorder = Recorder()
    replica = _replica(recorder)

    async def serve_stops_it() -> None:  # Serve calls __del__ on the replica's loop and awaits what it returns
        leaving = replica.__del__()
        assert recorder.done == ["heartbeat stopped"]
        await leaving

    asyncio.run(serve_stops_it())
    assert recorder.done == ["heartbeat stopped", "deregistered", "engine stopped"]
    assert replica.__del__() is None  # the garbage collector's call: nothing left to do
    assert recorder.done == ["heartbeat stopped", "deregistered", "engine stopped"]


def test_without_a_loop_the_engine_stops_at_once_and_the_lease_lapses() -> None:
    recorder = Recorder()
    replica = _replica(recorder)
    assert replica.__del__() is None
    assert recorder.done == ["heartbeat stopped", "engine stopped"]
