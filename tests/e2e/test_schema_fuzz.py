"""Schemathesis against the gateway's own OpenAPI document (vLLM's request models, the gateway's headers).

Every generated request, valid or not, gets an answer the client can act on: 200, or a 4xx with OpenAI's
error body, never a 5xx and never a hang. Output lengths and sample counts are bounded so a valid case
costs the CPU engine a few tokens, not thousands (impossible sizes have their own tests).
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.e2e.conftest import auth

pytestmark = pytest.mark.e2e

BOUNDS = {"max_tokens": 8, "max_completion_tokens": 8, "n": 2, "best_of": 2, "logprobs": 5, "top_logprobs": 5}


@pytest.fixture(scope="module")
def schema(base_url: str):
    return schemathesis.openapi.from_dict(httpx.get(f"{base_url}/openapi.json", timeout=30).json())


def _bounded(body: object) -> object:
    if isinstance(body, dict):
        for field, most in BOUNDS.items():
            value = body.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and value > most:
                body[field] = most
    return body


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_generated_requests_get_a_clear_answer(base_url: str, api_keys: dict, schema, path: str) -> None:
    operation = schema[path]["POST"]

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=operation.as_strategy())
    def check(case) -> None:
        case.body = _bounded(case.body)
        response = case.call(base_url=base_url, headers={**(case.headers or {}), **auth(api_keys["calm"])},
                             timeout=120)
        assert response.status_code in {200, 400, 401, 403, 404, 413, 422, 429}, \
            (response.status_code, response.text[:300], case.body)
        if response.status_code != 200:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    check()
