"""Count a request's prompt tokens with the served model's own tokenizer (chat template applied).

Counted once, at the gateway, and passed on: the cost estimate, the length class and the context check all
use this number. The classifier tokenizes long prompts in a worker thread so the event loop keeps serving.

Counting is bounded the way vLLM bounds its own tokenizing: a text longer than ``within`` tokens could
possibly hold (the longest token of the vocabulary, in characters, times ``within``) is not tokenized at all,
so a client's megabytes of prompt cost the gateway a length check, not seconds of CPU.
"""

from __future__ import annotations

from typing import Any

from gateway.chat_rendering import build_chat_renderer
from gateway.errors import InvalidValue
from gateway.request_parsing import ParsedRequest, prompts_of

OFF_LOOP_ABOVE_CHARS = 4_000  # a body longer than this is counted (and checked) off the event loop


class PromptTokenCounter:
    """Prompt token counts for one model, from its Hugging Face tokenizer."""

    def __init__(self, model_path: str, engine_args: list[str] | None = None) -> None:
        from transformers import AutoTokenizer

        self._chat_renderer = build_chat_renderer(model_path, engine_args)  # chats as the replicas render them
        # the text vLLM renders is tokenized with vLLM's own tokenizer, loaded once; the model folder's otherwise
        self._tokenizer = (self._chat_renderer.tokenizer if self._chat_renderer is not None
                           else AutoTokenizer.from_pretrained(model_path))
        # no token covers more characters of text than its own string has (vLLM's max_chars_per_token)
        self._max_chars_per_token = max((len(token) for token in self._tokenizer.get_vocab()), default=1)

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer."""
        return self._tokenizer

    def count(self, parsed: ParsedRequest, within: int | None = None) -> list[int]:
        """Tokens of each prompt of ``parsed`` (one for a chat; a completion may send a batch), on the calling
        thread: the classifier takes a long body off the event loop (:data:`OFF_LOOP_ABOVE_CHARS`). A prompt
        whose text cannot fit in ``within`` tokens counts ``within + 1``, untokenized."""
        if parsed.endpoint == "chat":
            return [self._chat_tokens(parsed.body, within)]
        special = bool(parsed.body.get("add_special_tokens", True))
        return [self._completion_tokens(prompt, within, special) for prompt in prompts_of(parsed)]

    def _text_tokens(self, text: str, within: int | None, add_special_tokens: bool, param: str) -> int:
        if within is not None and len(text) > within * self._max_chars_per_token:
            return within + 1
        try:
            return len(self._tokenizer(text, add_special_tokens=add_special_tokens).input_ids)
        except (TypeError, ValueError) as exc:  # text it cannot encode: a lone UTF-16 surrogate ("\ud800")
            raise InvalidValue(f"{param}: the model's tokenizer cannot encode this text ({type(exc).__name__}).",
                               param=param) from None

    def _chat_tokens(self, body: dict[str, Any], within: int | None) -> int:
        # what vLLM renders (gateway/chat_rendering.py), then tokenized without special tokens unless the
        # request asks for them, as vLLM does
        text = self._chat_renderer.render(body) if self._chat_renderer is not None else self._template_as_sent(body)
        if isinstance(text, list):  # a template option had vLLM tokenize it
            return len(text)
        return self._text_tokens(text, within, bool(body.get("add_special_tokens", False)), "messages")

    def _template_as_sent(self, body: dict[str, Any]) -> str:
        # the model's template on the messages as sent, with the allowed options; the keyword arguments that
        # steer the rendering itself are the gateway's, set after the client's so no option can replace them
        options = {**(body.get("chat_template_kwargs") or {}), "tokenize": False,
                   "add_generation_prompt": body.get("add_generation_prompt", True),
                   "continue_final_message": body.get("continue_final_message", False)}
        try:
            return self._tokenizer.apply_chat_template(
                body["messages"], tools=body.get("tools"), documents=body.get("documents"), **options)
        except Exception as exc:  # the model's template refuses these messages (roles, order, content)
            raise InvalidValue(f"messages: the model's chat template cannot render them ({type(exc).__name__}: "
                               f"{str(exc)[:200]}).", param="messages") from None

    def _completion_tokens(self, prompt: Any, within: int | None, special: bool = True) -> int:
        if isinstance(prompt, str):
            return self._text_tokens(prompt, within, special, "prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(token, int) for token in prompt):
            return len(prompt)
        if isinstance(prompt, list):  # a batch of prompts: the request costs all of them
            return sum(self._completion_tokens(item, within, special) for item in prompt)
        return 0
