"""What a client is told when vLLM fails its request (replicas/failed_replies.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from replicas.failed_replies import (as_client_error, explain_error_event, is_engine_failure, status_of,
                                     stream_opening, structured_output_fields)

ENGINE_FAILED = {"error": {"message": "Internal server error", "type": "InternalServerError", "param": None,
                           "code": 500}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}


def _sse(event: dict | str) -> str:
    return f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n"


def _chunk(delta: dict, finish: str | None = None, **extra) -> str:
    return _sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                                 "finish_reason": finish}], **extra})


ROLE = _chunk({"role": "assistant", "content": ""}, usage={"prompt_tokens": 9, "total_tokens": 9})
TEXT = _chunk({"content": "Hi"})


def _opening(lines: list[str]) -> tuple[dict | None, list[str], list[str]]:
    """stream_opening's answer, and the lines it left unread."""
    async def lines_of() -> AsyncIterator[str]:
        for line in lines:
            yield line

    async def run() -> tuple[dict | None, list[str], list[str]]:
        stream, held = lines_of(), []
        error = await stream_opening(stream, held)
        return error, held, [line async for line in stream]

    return asyncio.run(run())


@pytest.mark.parametrize("body, fields", [
    ({"response_format": SCHEMA}, ["response_format"]),
    ({"response_format": {"type": "json_object"}}, ["response_format"]),
    ({"response_format": {"type": "text"}}, []),
    ({"structured_outputs": {"regex": "a"}}, ["structured_outputs"]),
    ({"tools": [{"type": "function"}]}, []),  # a call the model may or may not make: no grammar
    ({"tools": [{"type": "function"}], "tool_choice": "auto"}, []),
    ({"tools": [{"type": "function"}], "tool_choice": "required"}, ["tools"]),
    ({"tools": [{"type": "function"}], "tool_choice": {"type": "function", "function": {"name": "f"}}}, ["tools"]),
    ({"messages": []}, []),
])
def test_the_fields_an_engine_compiles_into_a_grammar(body: dict, fields: list[str]) -> None:
    assert structured_output_fields(body) == fields


def test_an_engine_failure_under_a_grammar_is_the_requests_400_naming_its_field() -> None:
    status, body = as_client_error(ENGINE_FAILED, {"structured_outputs": {"regex": "[^\\s\\S]"}})
    assert status == 400
    assert body["error"]["param"] == "structured_outputs" and body["error"]["type"] == "BadRequestError"
    assert "`structured_outputs`" in body["error"]["message"]


@pytest.mark.parametrize("status, error, request_body", [
    (500, ENGINE_FAILED, {"messages": []}),  # no grammar: the engine's own failure stays a 5xx
    (500, {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}, {"response_format": SCHEMA}),
    (400, {"error": {"message": "Grammar error: x", "type": "BadRequestError", "code": 400}},
     {"response_format": SCHEMA}),
])
def test_other_errors_pass_unchanged(status: int, error: dict, request_body: dict) -> None:
    assert as_client_error(error, request_body) == (status, error)


def test_the_status_is_the_errors_code_or_500() -> None:
    assert status_of(ENGINE_FAILED) == 500 and status_of({"error": {"code": 422}}) == 422
    assert status_of({"error": {"message": "no code"}}) == 500 and status_of({"error": {"code": "400"}}) == 500


def test_only_vllms_generation_error_is_an_engine_failure() -> None:
    assert is_engine_failure(ENGINE_FAILED)
    assert not is_engine_failure({"error": {"message": "Internal server error", "type": "BadRequestError"}})
    assert not is_engine_failure({"error": "Internal server error"}) and not is_engine_failure(None)


def test_a_stream_that_fails_after_its_role_chunk_is_an_error_before_any_output() -> None:
    error, held, rest = _opening([ROLE, _sse(ENGINE_FAILED), _sse("[DONE]")])
    assert error == ENGINE_FAILED and held == [ROLE] and rest == [_sse("[DONE]")]


def test_a_stream_whose_first_event_is_an_error_is_that_error() -> None:
    failure = {"error": {"message": "Grammar error: Unsatisfiable schema", "type": "BadRequestError", "code": 400}}
    error, held, _ = _opening([_sse(failure), _sse("[DONE]")])
    assert error == failure and held == []


@pytest.mark.parametrize("first_output", [
    TEXT,
    _chunk({"tool_calls": [{"index": 0, "function": {"name": "f"}}]}),
    _chunk({}, finish="length"),
    _sse({"object": "text_completion", "choices": [{"index": 0, "text": "Hi", "finish_reason": None}]}),
    _sse("[DONE]"),
])
def test_a_stream_is_read_only_up_to_its_first_output(first_output: str) -> None:
    usage_only = _sse({"object": "chat.completion.chunk", "choices": [], "usage": {"total_tokens": 9}})
    later = [_chunk({"content": "!"}), _sse(ENGINE_FAILED)]  # an error after output stays in the stream
    error, held, rest = _opening([ROLE, usage_only, first_output, *later])
    assert error is None and held == [ROLE, usage_only, first_output] and rest == later


def test_an_engine_failure_after_output_is_explained_in_the_stream() -> None:
    """A grammar that dead-ends after some output: the status is sent, so the error event says what failed."""
    grammar = {"structured_outputs": {"regex": "a[^\\s\\S]"}}
    event = json.loads(explain_error_event(_sse(ENGINE_FAILED), grammar)[len("data: "):])
    assert event["error"]["code"] == 400 and event["error"]["param"] == "structured_outputs"
    assert explain_error_event(_sse(ENGINE_FAILED), {}) == _sse(ENGINE_FAILED)  # no grammar: the engine's own
    assert explain_error_event(TEXT, grammar) == TEXT
