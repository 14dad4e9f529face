"""Errors a client can see: typed, and mapped in one place to an HTTP status and an OpenAI error body.

The body has OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, so the OpenAI SDKs raise
their usual typed exceptions (BadRequestError, NotFoundError, ...) against this gateway.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


class GatewayError(Exception):
    """Base of every error the gateway answers with; subclasses fix status, type and code."""

    status: int = 500
    error_type: str = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The OpenAI-format error body."""
        return error_body(self.message, self.error_type, self.code, self.param)

    def response(self) -> JSONResponse:
        """The HTTP response for this error."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class InvalidJSON(GatewayError):
    """The body is not a JSON object."""

    status, error_type, code = 400, "invalid_request_error", "invalid_json"


class PayloadTooLarge(GatewayError):
    """The request body is larger than the gateway accepts."""

    status, error_type, code = 413, "invalid_request_error", "request_too_large"


class InvalidRequest(GatewayError):
    """The body is JSON but does not match the endpoint's schema."""

    status, error_type, code = 422, "invalid_request_error", "invalid_request"


class InvalidValue(GatewayError):
    """A field's value is one vLLM refuses (e.g. no prompt at all): 400, as vLLM answers it."""

    status, error_type, code = 400, "invalid_request_error", "invalid_value"


class ModelNotFound(GatewayError):
    """The request names a model this gateway does not serve."""

    status, error_type, code = 404, "invalid_request_error", "model_not_found"


class RouteNotFound(GatewayError):
    """No such endpoint."""

    status, error_type, code = 404, "invalid_request_error", "not_found"


class MethodNotAllowed(GatewayError):
    """The endpoint exists but not for this HTTP method."""

    status, error_type, code = 405, "invalid_request_error", "method_not_allowed"


class UpstreamUnavailable(GatewayError):
    """No replica could take the request (all gone, or failing)."""

    status, error_type, code = 503, "service_unavailable", "replica_unavailable"


class InvalidHeader(GatewayError):
    """A request header has a value the gateway does not accept."""

    status, error_type, code = 400, "invalid_request_error", "invalid_header"


class Unauthenticated(GatewayError):
    """No API key, a malformed Authorization header, or a key no tenant has."""

    status, error_type, code = 401, "authentication_error", "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class PermissionDenied(GatewayError):
    """The tenant may not use this model, or this band (when its tenant refuses requests above it)."""

    status, error_type, code = 403, "permission_error", "permission_denied"


class ContextLengthExceeded(GatewayError):
    """Prompt plus requested output does not fit the model's context."""

    status, error_type, code = 400, "invalid_request_error", "context_length_exceeded"


class Rejected(GatewayError):
    """A request turned away by admission: carries its reason in ``x-fleetgate-rejected-reason``."""

    def __init__(self, message: str, reason: str, retry_after_s: int | None = None) -> None:
        headers = {"x-fleetgate-rejected-reason": reason}
        if retry_after_s is not None:
            headers["Retry-After"] = str(retry_after_s)
        super().__init__(message, headers=headers)
        self.reason = reason


class QueueFull(Rejected):
    """The band's queue is at its limit: back off and retry."""

    status, error_type, code = 429, "rate_limit_error", "queue_full"


class QueueTimeout(Rejected):
    """No capacity came free before the request's queueing deadline."""

    status, error_type, code = 429, "rate_limit_error", "queue_timeout"


class RateLimited(Rejected):
    """The tenant's requests-per-minute or tokens-per-minute limit is reached."""

    status, error_type, code = 429, "rate_limit_error", "rate_limit_exceeded"

    @classmethod
    def after(cls, seconds: float) -> RateLimited:
        """The 429 for a tenant whose limits admit it again in ``seconds`` (Retry-After: whole seconds, >= 1)."""
        return cls("This API key's rate limit is reached; retry after the time in Retry-After.",
                   reason="rate-limited", retry_after_s=max(1, int(seconds + 0.999)))


class TooManyOpenRequests(Rejected):
    """The gateway replica is crowded and the tenant already holds its even split of it
    (policies/open_share.py)."""

    status, error_type, code = 429, "rate_limit_error", "too_many_open_requests"

    def __init__(self, retry_after_s: int) -> None:
        super().__init__("This API key holds its share of this gateway's open requests while the gateway is crowded; "
                         "retry after the time in Retry-After.", "tenant-open-share", retry_after_s=retry_after_s)


class QueueUnavailable(Rejected):
    """The global queue (Redis) cannot be reached."""

    status, error_type, code = 503, "service_unavailable", "queue_unavailable"


class GrantLost(Rejected):
    """The replica found no grant for the request: the queue lost it (Redis restarted empty, or the lease
    lapsed on the way). Nothing ran; the client may retry at once."""

    status, error_type, code = 503, "service_unavailable", "grant_lost"

    def __init__(self) -> None:
        super().__init__("The global queue lost this request's grant before it started; retry it.",
                         "grant-lost", retry_after_s=1)


class UpstreamError(GatewayError):
    """An error vLLM returned for the request, carried through with vLLM's status and message."""

    def __init__(self, status: int, message: str, code: str | None, param: str | None = None):
        super().__init__(message, param=param)
        self.status = status
        self.error_type = _openai_type_for_status(status)
        self.code = code


def shown(text: str, limit: int = 200) -> str:
    """A client's own value (a model name, say) as an error message quotes it: cut to ``limit`` characters,
    so an error never echoes a client's megabytes back."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


MAX_MESSAGE_CHARS = 1000  # vLLM's messages can quote the value at fault whole (a list of 10,000 bad words)


def error_body(message: str, error_type: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-format error body; a message past MAX_MESSAGE_CHARS is cut there (the request's own value
    quoted back, mostly)."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 1] + "…"
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def from_vllm_error(status: int, vllm_error_body: Any) -> UpstreamError:
    """Map a replica's error reply (its HTTP ``status`` and vLLM's ErrorResponse body) to an UpstreamError.
    The body is read defensively: whatever its shape, the client gets ``status`` and a message."""
    error = vllm_error_body.get("error") if isinstance(vllm_error_body, dict) else None
    error = error if isinstance(error, dict) else {}
    message = str(error.get("message") or "the model server reported an error")
    code = "context_length_exceeded" if _is_context_length_error(message) else None
    param = error.get("param")
    return UpstreamError(status if 400 <= status <= 599 else 502, message, code,
                         param if isinstance(param, str) else None)


def _is_context_length_error(message: str) -> bool:
    lowered = message.lower()
    return "context length" in lowered or "maximum context" in lowered or "max_model_len" in lowered


def _openai_type_for_status(status: int) -> str:
    if status in (400, 404, 413, 422):
        return "invalid_request_error"
    if status in (401, 403):
        return "authentication_error" if status == 401 else "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status == 503:
        return "service_unavailable"
    return "internal_error"
