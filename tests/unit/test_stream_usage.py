"""A stream is charged by the engine's own count wherever it is cut, and the client sees only the usage it
asked for. Its replica remembers the engine's latest count, lines held back for batching included
(replicas/stream_usage.py), and the gateway knows whether the stream reached its end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from gateway.accounting import StreamUsage
from replicas.stream_usage import LatestUsage


def _chunk(text: str, completion_tokens: int, prompt: int = 10) -> str:
    event = {"choices": [{"index": 0, "text": text}],
             "usage": {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                       "total_tokens": prompt + completion_tokens}}
    return f"data: {json.dumps(event)}\n\n"


def test_a_cut_stream_is_charged_what_the_engine_counted_not_its_chunks() -> None:
    usage = StreamUsage(prompt_tokens=10, client_wants_usage=False)
    sent = [usage.observe(_chunk("one", 1)), usage.observe(_chunk("two three four five", 5))]  # 4 tokens in 1 chunk
    assert usage.total_tokens == 15  # not prompt + 2 chunks
    assert all('"usage"' not in line for line in sent)  # the client did not ask for it
    assert [json.loads(line[6:])["choices"][0]["text"] for line in sent] == ["one", "two three four five"]


def test_usage_the_client_asked_for_goes_through() -> None:
    final = 'data: {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}\n\n'
    continuous = StreamUsage(prompt_tokens=10, client_wants_usage=True, client_wants_continuous=True)
    assert '"usage"' in continuous.observe(_chunk("x", 1)) and continuous.observe(final) == final
    only_final = StreamUsage(prompt_tokens=10, client_wants_usage=True)
    assert '"usage"' not in only_final.observe(_chunk("x", 1)) and only_final.observe(final) == final
    neither = StreamUsage(prompt_tokens=10, client_wants_usage=False)
    assert neither.observe(final) is None and neither.total_tokens == 15


async def _items(*items: object) -> AsyncIterator[object]:
    for item in items:
        yield item


async def test_a_replica_passes_items_unchanged_and_knows_the_engines_latest_count() -> None:
    header = {"status": 200, "stream": True}
    items = (header, _chunk("a", 1), _chunk("b", 2), "data: [DONE]\n\n")
    latest = LatestUsage(_items(*items))
    assert latest.total_tokens() is None
    seen = []
    async for item in latest:
        seen.append(item)
        if item == items[1]:
            assert latest.total_tokens() == 11
    assert seen == list(items) and latest.total_tokens() == 12


async def test_a_joined_message_counts_by_its_last_event_with_usage() -> None:
    latest = LatestUsage(_items(_chunk("a", 1) + _chunk("b c d", 4) + 'data: {"choices": []}\n\n'))
    async for _ in latest:
        pass
    assert latest.total_tokens() == 14


def test_a_stream_is_finished_only_once_its_end_came_through() -> None:
    usage = StreamUsage(prompt_tokens=10, client_wants_usage=False)
    usage.observe(_chunk("a", 1))
    assert not usage.finished and usage.total_tokens == 11
    usage.observe("data: [DONE]\n\n")
    assert usage.finished
