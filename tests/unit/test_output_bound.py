"""A request that takes the end of sequence away is estimated at what it forces, not at the typical output,
so it cannot look cheap at its grant (fairness, the token rate limit) and win grants until it completes."""

import asyncio
import json
from pathlib import Path

import pytest

from fleet.config import QueueConfig
from gateway.classify import RequestClassifier
from gateway.request_parsing import parse_request

CONTEXT = 4096
END = 1  # the tiny model's end of sequence (its generation config and tokenizer agree)


@pytest.fixture(scope="module")
def classifier(tiny_model_path: Path) -> RequestClassifier:
    return RequestClassifier(QueueConfig(default_output_tokens=128), str(tiny_model_path))


def _cost_and_prompt(classifier: RequestClassifier, **fields) -> tuple[int, int]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], **fields}  # a chat: no default
    size = asyncio.run(classifier.classify(parse_request(json.dumps(body).encode(), "chat"), CONTEXT))
    return size.cost, size.prompt_tokens


def test_an_honest_request_is_estimated_at_the_typical_output(classifier: RequestClassifier) -> None:
    cost, prompt = _cost_and_prompt(classifier)
    assert cost == prompt + 128
    cost, prompt = _cost_and_prompt(classifier, allowed_token_ids=[END, 5, 6], logit_bias={"5": -100, str(END): 5})
    assert cost == prompt + 128  # the end token is still there to stop it


@pytest.mark.parametrize("fields", [
    {"ignore_eos": True},
    {"logit_bias": {str(END): -100}},
    {"allowed_token_ids": [5, 6, 7]},
    {"bad_words": ["<|im_end|>"]},
], ids=["ignore_eos", "logit_bias", "allowed_token_ids", "bad_words"])
def test_a_request_without_its_end_token_is_estimated_to_the_contexts_end(classifier: RequestClassifier,
                                                                           fields: dict) -> None:
    cost, prompt = _cost_and_prompt(classifier, **fields)
    assert cost == CONTEXT  # the prompt and all the room it leaves
    cost, prompt = _cost_and_prompt(classifier, max_tokens=50, **fields)
    assert cost == prompt + 50  # max_tokens still bounds it


def test_min_tokens_is_the_least_output_expected(classifier: RequestClassifier) -> None:
    cost, prompt = _cost_and_prompt(classifier, min_tokens=1000)
    assert cost == prompt + 1000
    cost, prompt = _cost_and_prompt(classifier, min_tokens=10)
    assert cost == prompt + 128
