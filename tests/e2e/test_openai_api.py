"""End to end: the OpenAI API of `serve run deploy/local.yaml` (gateways + 2 real vLLM CPU replicas).

The OpenAI Python SDK is the client, as it is for users; raw httpx checks the wire format where the SDK
would hide it.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.conftest import TINY_MODEL_NAME
from tests.e2e.conftest import auth

pytestmark = pytest.mark.e2e

ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def client(base_url: str, api_keys: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_keys["calm"], max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def headers(api_keys: dict) -> dict[str, str]:
    return auth(api_keys["calm"])


def test_health(base_url: str) -> None:
    assert httpx.get(f"{base_url}/health").json() == {"status": "ok"}
    assert httpx.head(f"{base_url}/health").status_code == 200  # load balancers that probe with HEAD


def test_list_models(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [model.id for model in models.data] == [TINY_MODEL_NAME]
    assert "/" not in json.dumps(models.model_dump())  # vLLM's `root` (the model's folder) is not shown
    assert client.models.retrieve(TINY_MODEL_NAME).id == TINY_MODEL_NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_completion(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model=TINY_MODEL_NAME, prompt="The fleet", max_tokens=6, extra_body={"ignore_eos": True}
    )
    assert completion.object == "text_completion"
    assert completion.choices[0].text
    assert completion.usage.completion_tokens == 6
    assert completion.usage.prompt_tokens > 0


def test_chat_completion(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=TINY_MODEL_NAME, messages=[{"role": "user", "content": "Hello"}], max_tokens=5,
        extra_body={"ignore_eos": True},
    )
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content
    assert chat.usage.completion_tokens == 5


def test_band_priority_reaches_vllm(client: openai.OpenAI) -> None:
    # Under vLLM's default FCFS policy a non-zero priority is an error; the batch band is vLLM priority 2, so
    # success shows the priority scheduler. A body `priority` is replaced by the band's (no queue-jumping).
    chat = client.chat.completions.with_raw_response.create(
        model=TINY_MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
        extra_body={"priority": -100}, extra_headers={"x-priority": "batch"},
    )
    assert chat.headers["x-fleetgate-band"] == "batch"
    assert chat.parse().choices[0].finish_reason in {"length", "stop"}


def test_chat_stream_sdk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=TINY_MODEL_NAME, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=8,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert len(chunks) > 2
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == 8


def test_stream_wire_format_ends_with_done(base_url: str, headers: dict) -> None:
    body = {"model": TINY_MODEL_NAME, "prompt": "Once", "max_tokens": 4, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
    # vLLM joins the deltas a busy reader has not taken yet, so 4 tokens may come in fewer chunks
    assert len(payloads) >= 2 and all(p["choices"] for p in payloads[:-1])
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 4
    assert {p["object"] for p in payloads} == {"text_completion"}


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS
    return error


def test_malformed_json_is_400(base_url: str, headers: dict) -> None:
    response = httpx.post(f"{base_url}/v1/chat/completions", content=b"{not json",
                          headers={**headers, "content-type": "application/json"})
    assert _error(response, 400)["code"] == "invalid_json"


def test_schema_error_is_422(client: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.completions.create(model=TINY_MODEL_NAME, prompt="x", max_tokens="many")  # type: ignore[arg-type]
    assert caught.value.body["param"] == "max_tokens"


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["code"] == "model_not_found"


def test_a_request_naming_no_model_is_422(base_url: str, headers: dict) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert _error(httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers), 422)["param"] == "model"


def test_prompt_over_context_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=TINY_MODEL_NAME, prompt="hello world " * 3000, max_tokens=4)
    assert caught.value.body["code"] == "context_length_exceeded"


def test_a_prompt_over_context_that_asks_for_truncation_is_served_truncated(client: openai.OpenAI) -> None:
    """vLLM's ``truncate_prompt_tokens`` keeps that many tokens: the gateway counts the prompt as the engine runs
    it, so it neither refuses the request nor charges the tenant for the tokens cut."""
    completion = client.completions.create(model=TINY_MODEL_NAME, prompt="hello world " * 3000, max_tokens=2,
                                           extra_body={"truncate_prompt_tokens": 64})
    assert completion.usage.prompt_tokens == 64


def test_negative_max_tokens_is_400(base_url: str, headers: dict) -> None:
    body = {"model": TINY_MODEL_NAME, "prompt": "x", "max_tokens": -1}
    assert _error(httpx.post(f"{base_url}/v1/completions", json=body, headers=headers), 400)["param"] == "max_tokens"


def test_unknown_route_and_method(base_url: str) -> None:
    assert _error(httpx.get(f"{base_url}/v1/nothing"), 404)["code"] == "not_found"
    unserved = _error(httpx.post(f"{base_url}/v1/responses", json={"input": "hi"}), 404)  # says what is served
    assert "POST /v1/chat/completions" in unserved["message"] and "GET /v1/models" in unserved["message"]
    wrong_method = httpx.get(f"{base_url}/v1/completions")
    assert _error(wrong_method, 405)["code"] == "method_not_allowed" and wrong_method.headers["allow"] == "POST"


def test_a_trailing_slash_is_served_not_redirected(base_url: str, headers: dict) -> None:
    """Starlette's 307 pointed at a URL built from the Host header (plain http behind a TLS proxy)."""
    body = {"model": TINY_MODEL_NAME, "prompt": "x", "max_tokens": 1}
    reply = httpx.post(f"{base_url}/v1/completions/", json=body, headers=headers, timeout=60)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 1
    assert httpx.get(f"{base_url}/v1/models/", headers=headers).status_code == 200
    assert _error(httpx.get(f"{base_url}/v1/nothing/"), 404)["code"] == "not_found"
