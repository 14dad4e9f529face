"""A request that sets vLLM's ``truncate_prompt_tokens`` is counted, classed and checked against the context
as the engine will run it: truncated, not refused for the length it asked vLLM to cut."""

import asyncio
import json
from pathlib import Path

import pytest

from fleet.config import QueueConfig
from gateway.classify import RequestClassifier
from gateway.errors import ContextLengthExceeded, InvalidValue
from gateway.request_parsing import parse_request

CONTEXT = 256


def _classify(body: dict, endpoint: str, model: Path):
    classifier = RequestClassifier(QueueConfig(), str(model))
    return asyncio.run(classifier.classify(parse_request(json.dumps(body).encode(), endpoint), CONTEXT))


def test_a_truncated_prompt_is_counted_at_the_length_it_keeps(tiny_model_path: Path) -> None:
    long = {"model": "m", "prompt": "word " * 1000, "max_tokens": 4}
    with pytest.raises(ContextLengthExceeded):
        _classify(long, "completion", tiny_model_path)
    assert _classify({**long, "truncate_prompt_tokens": 100}, "completion", tiny_model_path).prompt_tokens == 100
    short = _classify({**long, "prompt": "word", "truncate_prompt_tokens": 100}, "completion", tiny_model_path)
    assert short.prompt_tokens < 100  # a prompt shorter than the cut keeps its own count


def test_minus_one_keeps_what_the_context_holds_with_a_token_to_generate(tiny_model_path: Path) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "word " * 1000}], "truncate_prompt_tokens": -1}
    assert _classify(body, "chat", tiny_model_path).prompt_tokens == CONTEXT - 1
    with pytest.raises(ContextLengthExceeded):  # and the output it asks for must still fit beside it
        _classify({**body, "max_tokens": 2}, "chat", tiny_model_path)


def test_a_batch_truncates_each_prompt(tiny_model_path: Path) -> None:
    body = {"model": "m", "prompt": ["word " * 1000, "word " * 500], "truncate_prompt_tokens": 50}
    assert _classify(body, "completion", tiny_model_path).prompt_tokens == 100


def test_a_cut_longer_than_the_context_is_400(tiny_model_path: Path) -> None:
    body = {"model": "m", "prompt": "word", "truncate_prompt_tokens": CONTEXT + 1}
    with pytest.raises(InvalidValue) as caught:
        _classify(body, "completion", tiny_model_path)
    assert caught.value.status == 400 and caught.value.param == "truncate_prompt_tokens"
