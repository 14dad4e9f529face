"""A stream is charged by the engine's own count wherever it is cut, and the client sees only the usage it
asked for."""

from __future__ import annotations

import json

from gateway.accounting import StreamUsage


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
