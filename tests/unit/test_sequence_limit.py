"""A request may ask for at most as many engine sequences (prompts times ``n``) as the configured limit: the
queue grants it one sequence slot, so more would fill its replica's engine past the grant."""

import asyncio
import json
from pathlib import Path

import pytest

from fleet.config import QueueConfig
from gateway.classify import RequestClassifier
from gateway.config import AppConfig
from gateway.errors import InvalidValue
from gateway.request_parsing import parse_request


def _classify(limit: int | None, body: dict, endpoint: str, model: Path):
    classifier = RequestClassifier(QueueConfig(), str(model), limit)
    return asyncio.run(classifier.classify(parse_request(json.dumps(body).encode(), endpoint), 4096))


def test_a_request_of_more_sequences_than_the_limit_is_400_naming_n(tiny_model_path: Path) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 5}
    with pytest.raises(InvalidValue) as caught:
        _classify(4, body, "chat", tiny_model_path)
    assert caught.value.status == 400 and caught.value.param == "n"
    assert "5 sequences" in caught.value.message
    assert _classify(5, body, "chat", tiny_model_path).cost > 0  # at the limit it passes


def test_a_batch_counts_every_prompt_and_names_the_prompt(tiny_model_path: Path) -> None:
    body = {"model": "m", "prompt": ["a"] * 9}
    with pytest.raises(InvalidValue) as caught:
        _classify(8, body, "completion", tiny_model_path)
    assert caught.value.param == "prompt"
    with pytest.raises(InvalidValue):
        _classify(8, {**body, "prompt": ["a"] * 3, "n": 3}, "completion", tiny_model_path)
    assert _classify(None, body, "completion", tiny_model_path).prompt_tokens > 0  # no limit


def test_the_default_limit_is_the_smallest_engines_batch() -> None:
    pools = [{"name": "small", "engine": {"max_num_seqs": 16}}, {"name": "large", "engine": {"max_num_seqs": 256}}]
    config = AppConfig.model_validate({"model": {"name": "m", "path": "p"}, "pools": pools})
    assert config.sequence_limit() == 16
    configured = AppConfig.model_validate({"model": {"name": "m", "path": "p"}, "pools": pools,
                                           "gateway": {"max_sequences_per_request": 4}})
    assert configured.sequence_limit() == 4
