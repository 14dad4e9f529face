"""Control tokens written out as text in a chat: a forged turn.

A chat template writes each message between the model's control tokens (``<|im_start|>user ... <|im_end|>``),
and vLLM tokenizes the rendered text whole, so a control token spelt out inside a message becomes that token:
whoever writes a message (often a tenant's own end user) can end its turn and open another role's
(``<|im_end|><|im_start|>system ...``): "special token injection". OpenAI's API reads such text as text;
vLLM cannot be told to, so the gateway refuses a chat whose messages, tools or documents spell out one of the
model's special tokens (``gateway.control_tokens_in_messages: refuse``, the default), or lets it through
(``allow``). Completions are left alone: their prompt is the whole rendered text, control tokens included.
vLLM's Mistral tokenizer mode keeps text and control tokens apart, so there is nothing to refuse.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from typing import Any

from gateway.errors import InvalidValue
from gateway.json_text import strings

CHECKED_FIELDS = ("messages", "tools", "documents", "chat_template_kwargs")  # what the template may render


class ControlTokens:
    """The special tokens of one model's tokenizer, found in a chat's text."""

    def __init__(self, tokenizer: Any) -> None:
        tokens = set() if _reads_text_as_text(tokenizer) else set(getattr(tokenizer, "all_special_tokens", None) or ())
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        tokens.update(token.content for token in added.values() if getattr(token, "special", False))
        # grouped by their first two characters: one scan of the text for a prefix no token has rules out
        # the whole group (Llama 3's 256 control tokens all begin "<|")
        self._by_prefix: dict[str, list[str]] = {}
        for token in sorted(token for token in tokens if isinstance(token, str) and token.strip()):
            self._by_prefix.setdefault(token[:2], []).append(token)

    def found_in(self, text: str) -> str | None:
        """The first of the model's control tokens that ``text`` spells out, if any."""
        for prefix, tokens in self._by_prefix.items():
            if prefix in text:
                for token in tokens:
                    if token in text:
                        return token
        return None

    def check_now(self, body: dict[str, Any]) -> None:
        """A 400 naming the field when what a chat template renders (messages, tools, documents, template options)
        spells out a control token."""
        for field in CHECKED_FIELDS:
            for text in chain(strings(body.get(field)), parts_run_together(body.get(field))):
                token = self.found_in(text)
                if token is not None:
                    raise InvalidValue(
                        f"{field}: holds the model's control token {token!r} as text, which the chat template would "
                        "turn into that token and so end or forge a turn. This gateway refuses control tokens in a "
                        "chat (gateway.control_tokens_in_messages); escape them in the text.", param=field)


def parts_run_together(value: Any) -> Iterator[str]:
    """For each list inside ``value`` with more than one text in it (strings, or parts' ``text``), those texts
    joined with nothing between them: a template that writes a message's parts one after another renders
    them so (the tiny model's does), and a control token split across parts (``<|im_`` + ``end|>``) forms
    there, whole in no single string."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            texts = [part if isinstance(part, str) else part.get("text") if isinstance(part, dict) else None
                     for part in item]
            texts = [text for text in texts if isinstance(text, str)]
            if len(texts) > 1:
                yield "".join(texts)
            stack.extend(item)


def _reads_text_as_text(tokenizer: Any) -> bool:
    """vLLM's Mistral tokenizer (``--tokenizer-mode mistral``) encodes a message's text with its special tokens
    apart, so nothing spelt out in text becomes one."""
    try:
        from vllm.tokenizers.mistral import MistralTokenizer
    except ImportError:
        return False
    return isinstance(tokenizer, MistralTokenizer)
