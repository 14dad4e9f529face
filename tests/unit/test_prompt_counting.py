"""The gateway counts a prompt as vLLM does (the chat template rendered, then tokenized without special
tokens), and never tokenizes a text longer than the context could hold (vLLM's own bound)."""

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.request_parsing import parse_request
from gateway.tokens import PromptTokenCounter


class _SpyTokenizer:
    """The real tokenizer, recording the length of every text it is asked to tokenize."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer, self.tokenized = tokenizer, []

    def __call__(self, text: str, **options: Any) -> Any:
        self.tokenized.append(len(text))
        return self._tokenizer(text, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


@pytest.fixture(scope="module")
def counter(tiny_model_path: Path) -> PromptTokenCounter:
    return PromptTokenCounter(str(tiny_model_path))


def _count(counter: PromptTokenCounter, body: dict, endpoint: str, within: int | None = None) -> list[int]:
    return counter.count(parse_request(json.dumps(body).encode(), endpoint), within)


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "hello there, how are you?"}]},
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo 漢字"},
                  {"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"}]},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
     "continue_final_message": True, "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "weather?"}],
     "tools": [{"type": "function", "function": {"name": "f", "description": "find",
                                                 "parameters": {"type": "object"}}}], "tool_choice": "none"},
], ids=["one", "several", "continue", "tools"])
def test_a_chat_counts_what_the_template_tokenizes(counter: PromptTokenCounter, tiny_model_path: Path,
                                                   body: dict) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    expected = tokenizer.apply_chat_template(
        body["messages"], tools=body.get("tools"), tokenize=True, return_dict=False,
        add_generation_prompt=body.get("add_generation_prompt", True),
        continue_final_message=body.get("continue_final_message", False))
    assert _count(counter, {"model": "m", **body}, "chat") == [len(expected)]


def test_a_text_too_long_for_the_context_is_not_tokenized(counter: PromptTokenCounter) -> None:
    short = "word " * 100
    expected = _exact(counter, short)
    spy = _SpyTokenizer(counter._tokenizer)
    counter._tokenizer = spy
    try:
        huge = "word " * 200_000
        assert _count(counter, {"model": "m", "prompt": huge}, "completion", within=4096) == [4097]
        assert _count(counter, {"model": "m", "messages": [{"role": "user", "content": huge}]}, "chat",
                      within=4096) == [4097]
        assert spy.tokenized == []  # a length check, not a megabyte of tokenizing
        assert _count(counter, {"model": "m", "prompt": short}, "completion", within=4096) == [expected]
        assert spy.tokenized == [len(short)]
    finally:
        counter._tokenizer = spy._tokenizer


def _exact(counter: PromptTokenCounter, text: str) -> int:
    return len(counter._tokenizer(text).input_ids)


def test_a_text_near_the_bound_is_still_counted_exactly(counter: PromptTokenCounter) -> None:
    # 25,000 characters are within the character bound for 4,096 tokens of this vocabulary, so they are
    # tokenized (and found over the context), not guessed; without a bound every text is counted exactly
    near = "word " * 5000
    assert 4096 < _exact(counter, near) and len(near) <= 4096 * counter._max_chars_per_token
    assert _count(counter, {"model": "m", "prompt": near}, "completion", within=4096) == [_exact(counter, near)]
    huge = "word " * 200_000
    assert _count(counter, {"model": "m", "prompt": huge}, "completion") == [_exact(counter, huge)]


def test_a_request_that_asks_for_special_tokens_or_none_is_counted_so(counter: PromptTokenCounter) -> None:
    # vLLM adds the tokenizer's special tokens to a completion's prompt and not to a rendered chat, unless the
    # request's add_special_tokens says otherwise
    calls: list[bool] = []
    real = counter._tokenizer

    class _Recording(_SpyTokenizer):
        def __call__(self, text: str, **options: Any) -> Any:
            calls.append(options["add_special_tokens"])
            return real(text, **options)

    counter._tokenizer = _Recording(real)
    try:
        chat = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        for body, endpoint in (({"model": "m", "prompt": "hi"}, "completion"),
                               ({"model": "m", "prompt": "hi", "add_special_tokens": False}, "completion"),
                               (chat, "chat"), ({**chat, "add_special_tokens": True}, "chat")):
            _count(counter, body, endpoint)
    finally:
        counter._tokenizer = real
    assert calls == [True, False, False, True]


@pytest.mark.parametrize("body, endpoint, param", [
    ({"model": "m", "prompt": "a\ud800b"}, "completion", "prompt"),
    ({"model": "m", "prompt": ["fine", "a\ud800b"]}, "completion", "prompt.1"),
    ({"model": "m", "messages": [{"role": "user", "content": "a\ud800"}]}, "chat", "messages.0.content"),
], ids=["prompt", "batch", "chat"])
def test_text_the_tokenizer_cannot_encode_is_400(counter: PromptTokenCounter, body: dict, endpoint: str,
                                                 param: str) -> None:
    """JSON may carry a lone UTF-16 surrogate: the parser refuses it, naming the field (gateway/json_text.py),
    before the tokenizer would (a TypeError, which was a 500)."""
    from gateway.errors import InvalidValue

    with pytest.raises(InvalidValue) as caught:
        _count(counter, body, endpoint)
    assert caught.value.status == 400 and caught.value.param == param
