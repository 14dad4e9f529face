"""Turn a raw HTTP body into a validated OpenAI request, using vLLM's own protocol models.

Validating at the gateway means a malformed request is answered before it takes a place in any queue or
on any replica; the replica validates again with the same models, so both ends agree on the schema.

The chat template is the operator's: a request may not send its own (`chat_template`: Jinja, code that
would run at the gateway and the replica), and may set only the template options the operator allows
(`chat_template_kwargs`), each to a plain value, so no client changes how its prompt is rendered or
counted beyond what the model's template offers. Nor may it send ``kv_transfer_params`` or
``ec_transfer_params``, which in disaggregated serving name KV (or encoder) caches on another engine, and of
``vllm_xargs`` (arguments for the engine's custom extensions) it may set only the keys the operator allows,
never one vLLM itself reads (those same transfer handles, the KV cache report mode).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError
from starlette.requests import Request

from gateway.errors import InvalidJSON, InvalidRequest, InvalidValue, PayloadTooLarge
from gateway.json_bounds import KEPT_ITEMS, MAX_ERRORS, MAX_VALUES, cut, values_over
from gateway.json_text import lone_surrogate_path
from replicas.failed_replies import structured_output_fields

Endpoint = Literal["chat", "completion"]

# fields the serving system sets between disaggregated engines (handles on another engine's caches)
SYSTEM_FIELDS = ("kv_transfer_params", "ec_transfer_params")
# keys of vllm_xargs that vLLM itself reads (vllm/v1/request.py), whatever the operator allows
ENGINE_XARGS = frozenset({*SYSTEM_FIELDS, "kv_cache_report_mode"})


@dataclass(frozen=True)
class ClientOptions:
    """What the operator lets a request set beyond the OpenAI fields: ``chat_template_kwargs`` keys (options
    the model's template reads) and ``vllm_xargs`` keys (arguments its engine's custom extensions read)."""

    template_options: frozenset[str] = frozenset()
    extension_args: frozenset[str] = frozenset()
    structured_output_bytes: int = 0  # the largest structured-output spec, as JSON (0: no limit)
    chat_items: int = 0  # the most messages, content parts and tool calls a chat may hold (0: no limit)


@dataclass(frozen=True)
class ParsedRequest:
    """A request that passed schema validation: the endpoint, the body as sent, and its key fields."""

    endpoint: Endpoint
    body: dict[str, Any]
    model: str
    stream: bool
    max_tokens: int | None
    body_chars: int
    sequences: int = 1  # output sequences per prompt: n (the beam width with beam search)
    truncate_prompt_tokens: int | None = None  # vLLM keeps this many prompt tokens (-1: what the context holds)
    prompt_logprobs: int | None = None  # top log-probabilities vLLM returns per prompt token (-1: the vocabulary)
    output_logprobs: int | None = None  # top log-probabilities vLLM returns per output token (-1: the vocabulary)

    @property
    def engine_requests(self) -> int:
        """Requests the engine runs for this one: ``n`` for each prompt of the batch."""
        return len(prompts_of(self)) * self.sequences


def prompts_of(parsed: ParsedRequest) -> list[Any]:
    """The prompts of ``parsed``: a chat's messages as one; a completion's prompt, or each of its batch (a
    list of strings or of token lists; one list of token ids is one prompt)."""
    if parsed.endpoint == "chat":
        return [parsed.body["messages"]]
    prompt = parsed.body.get("prompt", "")
    if isinstance(prompt, list) and prompt and not all(isinstance(token, int) for token in prompt):
        return prompt
    return [prompt]


def parse_request(raw_body: bytes, endpoint: Endpoint, options: ClientOptions = ClientOptions()) -> ParsedRequest:
    """Parse and validate ``raw_body`` for ``endpoint``; raise InvalidJSON, InvalidRequest or InvalidValue.

    ``options``: what beyond the OpenAI fields the operator lets a request set."""
    try:
        body = json.loads(raw_body, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise InvalidJSON("The request body is nested too deeply.") from None
    except ValueError as exc:  # bad JSON, bad UTF-8, NaN or Infinity, an integer of over 4,300 digits
        raise InvalidJSON(f"The request body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise InvalidJSON("The request body must be a JSON object.")
    model_class = _request_model(endpoint)
    from vllm.exceptions import VLLMClientError

    if values_over(body, len(raw_body)):
        raise InvalidJSON(f"The request body holds more than {MAX_VALUES} JSON values.")
    surrogate_at = lone_surrogate_path(body, raw_body)
    if surrogate_at is not None:
        field = surrogate_at[:200]
        raise InvalidValue(f"{field or 'The request body'}: a string holds an unpaired UTF-16 surrogate (an escape "
                           "from \\ud800 to \\udfff without its pair), which is not text.", param=field or None)
    if endpoint == "chat" and options.chat_items:
        _check_chat_items(body.get("messages"), options.chat_items)
    try:
        request = model_class.model_validate(body)
    except ValidationError as exc:
        raise _invalid_request(exc, body, model_class) from None
    except VLLMClientError as exc:  # vLLM's own validators raise these past pydantic; vLLM answers 400
        parameter = getattr(exc, "parameter", None)
        message = str(exc.args[0]) if exc.args else "invalid request"
        raise InvalidValue(message, param=parameter) from None
    for name in SYSTEM_FIELDS:
        if body.get(name) is not None:
            # disaggregated serving's handle on caches held by another engine: set by the serving system
            # between its engines, never by a client (one could name another request's blocks)
            raise InvalidValue(f"{name}: set by the serving system, not by a request.", param=name)
    _check_extension_args(body.get("vllm_xargs"), options.extension_args)
    if options.structured_output_bytes:
        _check_structured_output_size(body, options.structured_output_bytes)
    if endpoint == "chat":
        _check_chat(body, options.template_options)
    max_tokens = getattr(request, "max_completion_tokens", None) or getattr(request, "max_tokens", None)
    return ParsedRequest(
        endpoint=endpoint, body=body, model=request.model or "", stream=bool(request.stream),
        max_tokens=max_tokens, body_chars=len(raw_body), sequences=max(1, getattr(request, "n", 1) or 1),
        truncate_prompt_tokens=getattr(request, "truncate_prompt_tokens", None),
        prompt_logprobs=_prompt_logprobs(request), output_logprobs=_output_logprobs(request),
    )


def _prompt_logprobs(request: Any) -> int | None:
    """The prompt log-probabilities vLLM computes for ``request``, as its ``to_sampling_params`` reads them:
    ``prompt_logprobs``, or with ``echo`` the output's (``logprobs``; a chat's ``top_logprobs``)."""
    asked = getattr(request, "prompt_logprobs", None)
    if asked is None and getattr(request, "echo", False):
        asked = getattr(request, "top_logprobs" if hasattr(request, "top_logprobs") else "logprobs", None)
    return asked


def _output_logprobs(request: Any) -> int | None:
    """The top log-probabilities vLLM returns per output token: a completion's ``logprobs``; with a chat's
    ``logprobs: true``, its ``top_logprobs`` (0 by default: the sampled token's own)."""
    if hasattr(request, "top_logprobs"):
        return (request.top_logprobs or 0) if request.logprobs else None
    return getattr(request, "logprobs", None)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:20]} is out of range")
    return value


def _check_extension_args(xargs: dict[str, Any] | None, allowed: frozenset[str]) -> None:
    for key in xargs or {}:
        if key in ENGINE_XARGS or key not in allowed:
            names = ", ".join(sorted(allowed - ENGINE_XARGS)) or "none"
            raise InvalidValue(f"vllm_xargs: {key!r} is not an argument this gateway allows (allowed: {names}).",
                               param="vllm_xargs")


def _check_structured_output_size(body: dict[str, Any], limit: int) -> None:
    # a structured output is compiled to a grammar on the replica and its engine, beside that engine's streams
    for field in structured_output_fields(body):
        size = len(json.dumps(body[field], separators=(",", ":")))
        if size > limit:
            raise InvalidValue(f"{field}: its structured-output spec is {size} bytes; this gateway compiles at most "
                               f"{limit} (gateway.max_structured_output_bytes).", param=field)


def _check_chat_items(messages: Any, limit: int) -> None:
    # before validation, which costs 4-36 µs of GIL a message, part or tool call at the gateway and again on
    # the replica's event loop, beside its streams; a content part may render to no token at all, so the
    # context does not bound them
    if not isinstance(messages, list):
        return
    items = len(messages)
    for message in messages:
        if isinstance(message, dict):
            items += sum(len(message[key]) for key in ("content", "tool_calls") if isinstance(message.get(key), list))
    if items > limit:
        raise InvalidValue(f"messages: {items} messages, content parts and tool calls; this gateway takes at most "
                           f"{limit} (gateway.max_chat_items).", param="messages")


def _check_chat(body: dict[str, Any], template_options: frozenset[str]) -> None:
    if not body.get("messages"):
        raise InvalidValue("messages: at least one message is required.", param="messages")
    if body.get("chat_template") is not None:
        raise InvalidValue("chat_template: the chat template is the operator's; a request may not send its own.",
                           param="chat_template")
    options = body.get("chat_template_kwargs") or {}
    if not isinstance(options, dict):
        raise InvalidValue("chat_template_kwargs must be an object.", param="chat_template_kwargs")
    for key, value in options.items():
        if key not in template_options:
            allowed = ", ".join(sorted(template_options)) or "none"
            raise InvalidValue(f"chat_template_kwargs: {key!r} is not an option this gateway allows (allowed: "
                               f"{allowed}).", param="chat_template_kwargs")
        if not isinstance(value, str | int | float | bool | None):
            raise InvalidValue(f"chat_template_kwargs: {key!r} must be a string, number, boolean or null.",
                               param="chat_template_kwargs")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit`` bytes.

    A declared Content-Length over the limit is refused before anything is read; a body sent without one
    (chunked) is read only up to the limit.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The request body is {int(declared)} bytes; the limit is {limit}.")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes.")
    return bytes(body)


def preload_protocol_models() -> None:
    """Import vLLM's protocol models now (takes seconds), so the first request does not pay for it."""
    _request_model("chat")
    _request_model("completion")


def _request_model(endpoint: Endpoint) -> type:
    if endpoint == "chat":
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    return CompletionRequest


# errors that say only "the input is not of this union member's type": the least telling when others exist
_MISMATCH_TYPES = ("literal_error", "union_tag_invalid", "union_tag_not_found", "model_type", "dataclass_type")


def _invalid_request(exc: ValidationError, body: dict[str, Any], model_class: type) -> InvalidRequest:
    """A 422 naming the most telling error at its path in the body as sent (without pydantic's union member
    names). A union (a message's roles, ``stop``'s string or list) reports one error per member it tried: the
    path most members agree on is the one at fault, and there a limit on the value beats "not this type".
    Past :data:`MAX_ERRORS` errors, they are read from the body cut short (gateway/json_bounds.py)."""
    total = exc.error_count()
    if total > MAX_ERRORS:
        short = cut(body)
        try:
            model_class.model_validate(short)
        except ValidationError as cut_exc:
            exc, body = cut_exc, short
        else:  # the errors lie past the first items of some list
            return InvalidRequest(f"The request body has {total} errors, past the first {KEPT_ITEMS} items of a list.")
    errors = exc.errors(include_url=False, include_input=False)
    paths = [_body_path(error.get("loc", ()), body)[0] for error in errors]
    agree = Counter(paths)

    def rank(index: int) -> tuple[int, bool]:
        kind = errors[index].get("type", "")
        return -agree[paths[index]], kind.endswith("_type") or kind in _MISMATCH_TYPES

    chosen = min(range(len(errors)), key=rank)  # the first of the best rank: errors come in the schema's order
    first, param = errors[chosen], paths[chosen] or None
    message = first.get("msg", "invalid request")
    if param:
        message = f"{param}: {message}"
    extra = total - 1
    if extra:
        message += f" (and {extra} more error{'s' if extra > 1 else ''})"
    return InvalidRequest(message, param=param)


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "bytes"})


def _body_path(loc: tuple, body: Any) -> tuple[str, bool]:
    """``loc`` as a path in ``body`` (the keys and indexes it has, without the union members pydantic names:
    ``str``, ``list[str]``, a class name), and whether the body holds a value there (not: a required field it
    lacks, which ends the path)."""
    parts: list[str] = []
    node = body
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and part.isidentifier() and part.islower() \
                and part not in _TYPE_NAMES:
            return ".".join([*parts, part]), False
        else:
            continue  # a union member's name
        parts.append(str(part))
    return ".".join(parts), True
