"""A client that leaves before its reply: the tenant is charged what the engine did (the replica's record of
the cancelled call), never refunded work that ran, and charged exactly once."""

from __future__ import annotations

import asyncio
import contextvars
from types import SimpleNamespace

import pytest

from gateway.accounting import RUNNING_APART
from gateway.classify import Classification
from gateway.lifecycle import RequestLifecycle
from gateway.metrics import GatewayMetrics
from replicas.call_outcomes import CallOutcomes

PROMPT, ESTIMATE = 7, 7 + 500
# stands for Ray Serve's request context: a handle call made under a cancelled request's context is that
# request's child, and Ray Serve cancels it
PARENT_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("parent_request")


class _Pool:
    """One replica's side of a non-streamed call that never answers, and its record of what calls served."""

    def __init__(self, served: int | None | Exception, answer: asyncio.Event | None = None) -> None:
        self._served, self.asked, self.cancelled = served, [], False
        self.started, self.asking, self._answer = asyncio.Event(), asyncio.Event(), answer
        self.parent_seen: object = None

    def call(self, *args, **kwargs) -> _Pool:
        self.started.set()
        return self

    async def __anext__(self) -> dict:
        await asyncio.Event().wait()  # the engine is still working when the client leaves

    def cancel(self) -> None:
        self.cancelled = True

    async def served(self, pool: str, replica_id: str, ticket_id: str, timeout_s: float) -> int | None:
        self.asked.append((pool, replica_id, ticket_id))
        self.parent_seen = PARENT_REQUEST.get(None)
        self.asking.set()
        if self._answer is not None:
            await self._answer.wait()
        if isinstance(self._served, Exception):
            raise self._served
        return self._served


class _Place:
    pool, replica_id, ticket_id, prompt_tokens, queue_ms, stages = "latency", "r1", "t1", PROMPT, 0.0, {}

    def __init__(self) -> None:
        self.charged: list[int] = []

    async def release(self, served_tokens: int) -> None:
        self.charged.append(served_tokens)


def _lifecycle(pool: _Pool) -> RequestLifecycle:
    lifecycle = object.__new__(RequestLifecycle)
    lifecycle._pools, lifecycle._metrics, lifecycle._clock = pool, GatewayMetrics(), lambda: 0.0
    return lifecycle


def _request(lifecycle: RequestLifecycle, place: _Place) -> asyncio.Task:
    admission = SimpleNamespace(parsed=None, tenant=SimpleNamespace(id="acme"), arrived=0.0,
                                decision=SimpleNamespace(band="standard"),
                                size=Classification(PROMPT, "short", ESTIMATE))
    PARENT_REQUEST.set("the client's request")
    return asyncio.create_task(lifecycle._forward_and_relay(admission, place, (False, False), None))


async def _client_leaves_while_the_engine_works(pool: _Pool, place: _Place) -> None:
    request = _request(_lifecycle(pool), place)
    await pool.started.wait()
    await asyncio.sleep(0)  # the request now awaits its reply's header
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert pool.cancelled


async def test_a_client_gone_is_charged_what_its_engine_did_once() -> None:
    pool, place = _Pool(served=PROMPT + 41), _Place()
    await _client_leaves_while_the_engine_works(pool, place)
    assert pool.asked == [("latency", "r1", "t1")]  # asked of the replica its grant names
    assert place.charged == [PROMPT + 41]  # the replica's record, not the estimate, charged once


async def test_the_ask_is_not_a_child_of_the_cancelled_request() -> None:
    pool, place = _Pool(served=PROMPT + 41), _Place()
    await _client_leaves_while_the_engine_works(pool, place)
    assert pool.parent_seen is None  # asked in a fresh context: Ray Serve does not cancel it with the request


async def test_a_request_cancelled_again_while_asking_still_charges_what_its_engine_did() -> None:
    answer = asyncio.Event()
    pool, place = _Pool(served=PROMPT + 41, answer=answer), _Place()
    lifecycle = _lifecycle(pool)
    request = _request(lifecycle, place)
    await pool.started.wait()
    await asyncio.sleep(0)
    request.cancel()
    await pool.asking.wait()
    request.cancel()  # cancelled again while the replica is asked
    with pytest.raises(asyncio.CancelledError):
        await request
    assert place.charged == []  # nothing settled with the estimate meanwhile
    answer.set()
    await asyncio.gather(*RUNNING_APART)
    assert place.charged == [PROMPT + 41] and not RUNNING_APART


@pytest.mark.parametrize("answer", [None, TimeoutError(), RuntimeError("replica died")])
async def test_when_the_replica_cannot_say_the_estimate_is_charged(answer) -> None:
    pool, place = _Pool(served=answer), _Place()
    await _client_leaves_while_the_engine_works(pool, place)
    assert place.charged == [ESTIMATE]  # work that ran is never refunded


async def test_without_a_grant_the_estimate_is_charged() -> None:
    pool, place = _Pool(served=PROMPT), _Place()
    place.replica_id = place.ticket_id = None  # the no-queue baseline: no grant names a replica
    await _client_leaves_while_the_engine_works(pool, place)
    assert pool.asked == [] and place.charged == [ESTIMATE]


async def test_a_replica_remembers_what_each_call_served_and_gives_up_calls_not_yet_arrived() -> None:
    outcomes = CallOutcomes(kept=2)
    assert outcomes.begin("a")
    waiting = asyncio.create_task(outcomes.served("a", timeout_s=5))
    await asyncio.sleep(0)
    outcomes.end("a", 48)  # the cancelled call recorded the engine's count as it ended
    assert await waiting == 48 and await outcomes.served("a", timeout_s=0) == 48
    assert outcomes.begin("slow") and await outcomes.served("slow", timeout_s=0.01) is None  # not ended in time
    assert await outcomes.served("late", timeout_s=5) == 0  # never arrived: given up, so it runs nothing
    assert not outcomes.begin("late") and outcomes.begin("late")  # given up once
    outcomes.end("b", 1)
    outcomes.end("c", 2)
    assert await outcomes.served("c", timeout_s=0) == 2 and await outcomes.served("a", timeout_s=0) == 0  # a forgotten
