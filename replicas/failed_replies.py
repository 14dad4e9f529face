"""What a client is told when vLLM fails its request, and what the engine did for it.

- **Before a stream's first token.** vLLM starts a stream (HTTP 200) before it validates some of a request,
  then sends the error as the stream's first event. The replica reads up to the first event that carries
  output (role-only chunks before it are held back): if that is an error, the reply is that error with its
  own status, as a request that is not streamed gets.
- **An engine failure** (its engine finished the request with reason "error") is vLLM's 500 "Internal server
  error". In vLLM 0.32 the engine ends a request so when its structured-output grammar admits no token (a
  JSON schema that is only a reference to itself, a regex no string matches, ``root ::= root``) or fails to
  compile in the engine. For a request that carries such a grammar, that is bad input: a 400 naming its
  field. The engine did work for it (the prefill, or the grammar's compile), so the reply carries the
  request's prompt tokens as what it served, and its tenant is charged them. A grammar that dead-ends after
  some output fails the stream there: its error event says so in the same words (the status is sent).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

ENGINE_FAILURE = ("InternalServerError", "Internal server error")  # vLLM's GenerationError, as its ErrorResponse
ERROR_EVENT = 'data: {"error"'  # how vLLM's serving classes begin an error event


def structured_output_fields(body: dict[str, Any]) -> list[str]:
    """The fields of a request body that the engine compiles into a grammar: ``response_format``,
    ``structured_outputs``, and ``tools`` where ``tool_choice`` forces a call."""
    forced_tool = body.get("tool_choice") == "required" or isinstance(body.get("tool_choice"), dict)
    fields = ("response_format", "structured_outputs", *(("tools",) if forced_tool else ()))
    return [field for field in fields if body.get(field) is not None and _constrains(field, body[field])]


def _constrains(field: str, spec: Any) -> bool:
    return not (field == "response_format" and isinstance(spec, dict) and spec.get("type") == "text")


def is_engine_failure(error_body: Any) -> bool:
    """True for vLLM's answer to a request its engine finished with reason "error"."""
    error = error_body.get("error") if isinstance(error_body, dict) else None
    return isinstance(error, dict) and (error.get("type"), error.get("message")) == ENGINE_FAILURE


def status_of(error_body: dict[str, Any]) -> int:
    """The HTTP status of vLLM's error reply or event (its ``code``), 500 when it names none."""
    code = error_body["error"].get("code")
    return code if isinstance(code, int) and 400 <= code <= 599 else 500


def as_client_error(error_body: dict[str, Any], request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The status and body a client gets for vLLM's error reply ``error_body`` to ``request``."""
    fields = structured_output_fields(request)
    if not (is_engine_failure(error_body) and fields):
        return status_of(error_body), error_body
    names = " or ".join(f"`{field}`" for field in fields)
    message = (f"The engine could not generate under this request's {names}: its grammar admits no output the "
               "model can produce (for example a JSON schema that only refers to itself, or a pattern no string "
               "matches), or did not compile.")
    return 400, {"error": {"message": message, "type": "BadRequestError", "param": fields[0], "code": 400}}


def explain_error_event(line: str, request: dict[str, Any]) -> str:
    """An SSE line of a stream past its first token (the caller passes those that begin with ERROR_EVENT), an
    error event rewritten as :func:`as_client_error` would answer it (a grammar that dead-ends after some
    output: the engine fails the request there)."""
    event = _event(line)
    if event is None or not isinstance(event.get("error"), dict):
        return line
    _, body = as_client_error(event, request)
    return line if body is event else f"data: {json.dumps(body)}\n\n"


async def stream_opening(lines: AsyncIterator[str], held: list[str]) -> dict[str, Any] | None:
    """Read a vLLM stream up to its first event with output, into ``held``; the error event's body if the
    stream failed before any output. The lines are SSE events, one per item, as vLLM's serving classes yield
    them."""
    async for line in lines:
        event = _event(line)
        if event is not None and isinstance(event.get("error"), dict):
            return event
        held.append(line)
        if event is None or _carries_output(event):
            break
    return None


def _event(line: str) -> dict[str, Any] | None:
    """The JSON of one ``data:`` event; None for [DONE] or anything else."""
    payload = line.strip()
    if not payload.startswith("data: {"):
        return None
    try:
        event = json.loads(payload[len("data: "):])
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _carries_output(event: dict[str, Any]) -> bool:
    """A chunk with generated text, a tool call, log-probabilities or a finish; not a role-only or usage-only
    chunk."""
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict):
            return True
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        if choice.get("finish_reason") or choice.get("text") or choice.get("logprobs") or any(
                value for key, value in delta.items() if key != "role"):
            return True
    return False
