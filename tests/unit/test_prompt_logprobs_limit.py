"""A request may ask for at most ``gateway.max_prompt_logprob_entries`` prompt log-probabilities (its prompt
tokens times one more than its ``prompt_logprobs``): the engine computes the vocabulary's log-probabilities at
every prompt position, and its replica turns every entry into text at once, while its other streams wait.
``echo`` asks for them too, as vLLM reads it (a completion's ``logprobs``, a chat's ``top_logprobs``)."""

import asyncio
import json
from pathlib import Path

import pytest

from fleet.config import QueueConfig
from gateway.classify import RequestClassifier
from gateway.errors import InvalidValue
from gateway.request_parsing import parse_request


def _classify(limit: int, body: dict, endpoint: str, model: Path):
    classifier = RequestClassifier(QueueConfig(), str(model), max_prompt_logprob_entries=limit)
    return asyncio.run(classifier.classify(parse_request(json.dumps(body).encode(), endpoint), 4096))


def _prompt_tokens(body: dict, endpoint: str, model: Path) -> int:
    return _classify(0, body, endpoint, model).prompt_tokens


def test_prompt_logprobs_over_the_limit_are_400_naming_the_field(tiny_model_path: Path) -> None:
    body = {"model": "m", "prompt": "the fleet gateway routes tokens " * 20, "max_tokens": 1, "prompt_logprobs": 1}
    tokens = _prompt_tokens(body, "completion", tiny_model_path)
    assert _classify(2 * tokens, body, "completion", tiny_model_path).prompt_tokens == tokens  # at the limit
    with pytest.raises(InvalidValue) as caught:
        _classify(2 * tokens - 1, body, "completion", tiny_model_path)
    assert caught.value.status == 400 and caught.value.param == "prompt_logprobs"
    assert f"{2 * tokens} prompt log-probabilities" in caught.value.message
    assert _classify(0, body, "completion", tiny_model_path).prompt_tokens == tokens  # 0: no limit


def test_echo_asks_for_them_as_vllm_reads_it(tiny_model_path: Path) -> None:
    completion = {"model": "m", "prompt": "word " * 50, "max_tokens": 1, "echo": True, "logprobs": 3}
    tokens = _prompt_tokens(completion, "completion", tiny_model_path)
    with pytest.raises(InvalidValue) as caught:
        _classify(4 * tokens - 1, completion, "completion", tiny_model_path)
    assert caught.value.param == "echo"
    assert _classify(4 * tokens - 1, {**completion, "echo": False}, "completion", tiny_model_path).cost > 0
    # a chat's echo returns the prompt's log-probabilities at its top_logprobs, 0 by default: one per token
    chat = {"model": "m", "messages": [{"role": "user", "content": "word " * 50}], "echo": True}
    tokens = _prompt_tokens(chat, "chat", tiny_model_path)
    with pytest.raises(InvalidValue):
        _classify(tokens - 1, chat, "chat", tiny_model_path)
    assert _classify(tokens, chat, "chat", tiny_model_path).prompt_tokens == tokens


def test_the_whole_vocabulary_counts_as_such(tiny_model_path: Path) -> None:
    body = {"model": "m", "prompt": "x", "max_tokens": 1, "prompt_logprobs": -1}  # 1 token; 1,208 in the vocabulary
    with pytest.raises(InvalidValue) as caught:
        _classify(1_208, body, "completion", tiny_model_path)
    assert "1209 prompt log-probabilities" in caught.value.message
