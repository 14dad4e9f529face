"""Count a request's prompt tokens with the served model's own tokenizer (chat template applied).

Counted once, at the gateway, and passed on: the cost estimate, the length class and the context check all
use this number. Long prompts are tokenized in a worker thread so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.errors import InvalidValue
from gateway.request_parsing import ParsedRequest, prompts_of

OFF_LOOP_ABOVE_CHARS = 4_000


class PromptTokenCounter:
    """Prompt token counts for one model, from its Hugging Face tokenizer."""

    def __init__(self, model_path: str) -> None:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(model_path)

    async def count(self, parsed: ParsedRequest) -> list[int]:
        """Tokens of each prompt of ``parsed`` (one for a chat; a completion may send a batch), off the event
        loop when the body is long."""
        if parsed.body_chars > OFF_LOOP_ABOVE_CHARS:
            return await asyncio.to_thread(self.count_now, parsed)
        return self.count_now(parsed)

    def count_now(self, parsed: ParsedRequest) -> list[int]:
        """Tokens of each prompt of ``parsed``, on the calling thread."""
        if parsed.endpoint == "chat":
            return [self._chat_tokens(parsed.body)]
        return [self._completion_tokens(prompt) for prompt in prompts_of(parsed)]

    def _chat_tokens(self, body: dict[str, Any]) -> int:
        # what vLLM renders: the messages with the tools and documents the template reads, and the allowed
        # options (request parsing refused any other); the keyword arguments that steer the rendering itself
        # are the gateway's, set after the client's so no option can replace them
        options = {**(body.get("chat_template_kwargs") or {}), "tokenize": True,
                   "add_generation_prompt": body.get("add_generation_prompt", True),
                   "continue_final_message": body.get("continue_final_message", False)}
        try:
            ids = self._tokenizer.apply_chat_template(
                body["messages"], tools=body.get("tools"), documents=body.get("documents"), **options)
        except Exception as exc:  # the model's template refuses these messages (roles, order, content)
            raise InvalidValue(f"messages: the model's chat template cannot render them ({type(exc).__name__}: "
                               f"{str(exc)[:200]}).", param="messages") from None
        if hasattr(ids, "keys"):  # a BatchEncoding
            ids = ids["input_ids"]
        return len(ids)

    def _completion_tokens(self, prompt: Any) -> int:
        if isinstance(prompt, str):
            return len(self._tokenizer(prompt).input_ids)
        if isinstance(prompt, list) and prompt and all(isinstance(token, int) for token in prompt):
            return len(prompt)
        if isinstance(prompt, list):  # a batch of prompts: the request costs all of them
            return sum(self._completion_tokens(item) for item in prompt)
        return 0
