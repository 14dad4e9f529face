"""Render a chat to its prompt the way the replica's vLLM does, so the gateway counts what the engine runs.

vLLM prepares a chat before its template sees it. It detects whether the template reads a message's content
as a string or as a list of parts, and for a string template joins the text parts with "\\n". It turns
``content: null`` into no parts, parses tool-call arguments into objects, flattens a tool message's text
parts, folds ``developer`` into ``system`` where the template lacks that role, and passes the request's tools
as its protocol models dump them. A template applied to the raw messages misses each of these: it can
refuse an ordinary agent turn (an assistant message with tool calls and no content) or count a list against
a string template as its Python text. So the gateway renders with vLLM's own renderer, built for the same
model folder, and only tokenizes the text itself (bounded by the context, gateway/tokens.py).

Media are never fetched here. A model without a multimodal config refuses media parts, as vLLM does; for a
multimodal model the messages go to the template as sent, without the media's tokens (an undercount, which
completion corrects to what the engine counted).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from gateway.errors import InvalidValue

logger = logging.getLogger(__name__)


class VllmChatRenderer:
    """vLLM's chat renderer for one model folder, with the defaults of vLLM's OpenAI server."""

    def __init__(self, model_path: str) -> None:
        from vllm.config import ModelConfig, VllmConfig
        from vllm.renderers.registry import renderer_from_config

        config = VllmConfig(model_config=ModelConfig(model=model_path, tokenizer=model_path))
        self._renderer = renderer_from_config(config)
        self.multimodal = config.model_config.multimodal_config is not None
        self.render({"messages": [{"role": "user", "content": "warm up"}]})  # resolves and compiles the template

    def render(self, body: dict[str, Any]) -> str | list[int] | None:
        """The prompt of the chat ``body`` (validated): its text, or its token ids where the template's
        options ask vLLM to tokenize; None for media parts sent to a multimodal model (rendered as sent by the
        caller). Media parts sent to a text-only model are a 400, as on the replica."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest, ChatCompletionToolsParam
        from vllm.exceptions import VLLMClientError
        from vllm.renderers.chat_utils import has_non_text_content

        if has_non_text_content(body["messages"]):
            if self.multimodal:
                return None
            raise InvalidValue(f"messages: {body.get('model') or 'this model'} is not a multimodal model; send "
                               "text content parts only.", param="messages")

        # the chat parameters exactly as vLLM's serving layer builds them (OnlineRenderer.preprocess_chat)
        tools = body.get("tools")
        dumped = [ChatCompletionToolsParam.model_validate(tool).model_dump() for tool in tools] if tools else None
        params = ChatCompletionRequest.build_chat_params(_Fields(body, ChatCompletionRequest), None, "auto")
        params = params.with_defaults({"tools": dumped, "tokenize": False})
        try:
            _, prompt = self._renderer.render_messages(_unshared(body["messages"]), params)
        except VLLMClientError as exc:  # the template refused these messages, or a part vLLM takes from no one
            raise InvalidValue(f"messages: {str(exc.args[0] if exc.args else exc)[:300]}",
                               param=getattr(exc, "parameter", None) or "messages") from None
        except Exception as exc:  # messages that passed validation and still break vLLM's preparation
            logger.warning("vLLM's renderer failed on a chat: %s", type(exc).__name__)
            raise InvalidValue(f"messages: vLLM cannot render them ({type(exc).__name__}).",
                               param="messages") from None
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        return prompt["prompt"]


class _Fields:
    """The body's fields as attributes of the request model, defaults where absent, without validating again
    (pydantic's ``model_construct`` costs 0.5 ms a request)."""

    def __init__(self, body: dict[str, Any], model: type) -> None:
        self._body, self._model = body, model

    def __getattr__(self, name: str) -> Any:
        if name in self._body:
            return self._body[name]
        field = self._model.model_fields.get(name)
        if field is None:  # a vLLM that reads more than fields here fails the warm-up: the renderer is not used
            raise AttributeError(name)
        return field.get_default(call_default_factory=True)


def _unshared(messages: list[Any]) -> list[Any]:
    # vLLM parses tool-call arguments into objects in place; the body is forwarded to the replica as sent
    return [{**message, "tool_calls": copy.deepcopy(message["tool_calls"])}
            if isinstance(message, dict) and message.get("tool_calls") else message for message in messages]


def build_chat_renderer(model_path: str) -> VllmChatRenderer | None:
    """vLLM's renderer for ``model_path``, or None (logged) where vLLM cannot build one here: the gateway then
    applies the model's template to the messages as sent, an approximation of what the engine renders."""
    try:
        return VllmChatRenderer(model_path)
    except Exception as exc:  # a model vLLM reads only with engine options the gateway does not have
        logger.warning("vLLM's chat renderer could not be built for the model (%s: %s); chats are counted with "
                       "its template applied to the messages as sent", type(exc).__name__, str(exc)[:200])
        return None
