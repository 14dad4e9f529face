"""A reply that is not streamed may carry at most ``gateway.max_output_logprob_entries`` output
log-probabilities (its output tokens times one more than its ``logprobs`` / ``top_logprobs``, times its
sequences): it is built whole at its end, beside the replica's streams. Streams are not limited."""

import asyncio
import json
from pathlib import Path

import pytest

from fleet.config import QueueConfig
from gateway.classify import RequestClassifier
from gateway.errors import InvalidValue
from gateway.request_parsing import parse_request

CONTEXT = 4096


def _classify(limit: int, body: dict, endpoint: str, model: Path):
    classifier = RequestClassifier(QueueConfig(), str(model), max_output_logprob_entries=limit)
    return asyncio.run(classifier.classify(parse_request(json.dumps(body).encode(), endpoint), CONTEXT))


def test_a_completion_over_the_limit_is_400_naming_logprobs(tiny_model_path: Path) -> None:
    body = {"model": "m", "prompt": "once upon a time", "max_tokens": 195, "logprobs": 20}  # 195 x 21 = 4,095
    assert _classify(4096, body, "completion", tiny_model_path).cost > 0
    with pytest.raises(InvalidValue) as caught:
        _classify(4096, {**body, "max_tokens": 196}, "completion", tiny_model_path)
    assert caught.value.status == 400 and caught.value.param == "logprobs"
    assert "4116 log-probabilities" in caught.value.message and "Stream it" in caught.value.message
    assert _classify(4096, {**body, "max_tokens": 196, "stream": True}, "completion", tiny_model_path).cost > 0
    assert _classify(0, {**body, "max_tokens": 196}, "completion", tiny_model_path).cost > 0  # 0: no limit
    assert _classify(4096, {**body, "max_tokens": 4000, "logprobs": None}, "completion", tiny_model_path).cost > 0


def test_every_sequence_carries_its_own(tiny_model_path: Path) -> None:
    body = {"model": "m", "prompt": ["a", "b"], "max_tokens": 100, "logprobs": 4, "n": 3}  # 100 x 5 x 6 = 3,000
    assert _classify(3000, body, "completion", tiny_model_path).cost > 0
    with pytest.raises(InvalidValue) as caught:
        _classify(2999, body, "completion", tiny_model_path)
    assert "6 sequences" in caught.value.message


def test_a_chat_counts_its_top_logprobs_and_what_it_may_force(tiny_model_path: Path) -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    # no max_tokens: estimated at default_output_tokens (256), one entry a token by default
    assert _classify(256, chat, "chat", tiny_model_path).cost > 0
    with pytest.raises(InvalidValue) as caught:
        _classify(4096, {**chat, "top_logprobs": 20}, "chat", tiny_model_path)  # 256 x 21
    assert caught.value.param == "top_logprobs"
    # its end of sequence taken away, it may run to the end of the context
    with pytest.raises(InvalidValue):
        _classify(4000, {**chat, "ignore_eos": True}, "chat", tiny_model_path)
    assert _classify(4096, {**chat, "top_logprobs": 20, "stream": True}, "chat", tiny_model_path).cost > 0


def test_the_whole_vocabulary_counts_as_such(tiny_model_path: Path) -> None:
    body = {"model": "m", "prompt": "x", "max_tokens": 1, "logprobs": -1}
    try:
        parsed = parse_request(json.dumps(body).encode(), "completion")
    except InvalidValue:  # this vLLM refuses -1 for a completion's logprobs: nothing to bound
        return
    assert parsed.output_logprobs == -1
    with pytest.raises(InvalidValue) as caught:
        _classify(1_208, body, "completion", tiny_model_path)
    assert "1209 log-probabilities" in caught.value.message
