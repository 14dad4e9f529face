"""Render a chat to its prompt the way the replica's vLLM does, so the gateway counts what the engine runs.

vLLM prepares a chat before its template sees it. It detects whether the template reads a message's content
as a string or as a list of parts, and for a string template joins the text parts with "\\n". It turns
``content: null`` into no parts, parses tool-call arguments into objects, flattens a tool message's text
parts, folds ``developer`` into ``system`` where the template lacks that role, and passes the request's tools
as its protocol models dump them. A template applied to the raw messages misses each of these: it can
refuse an ordinary agent turn (an assistant message with tool calls and no content) or count a list against
a string template as its Python text. So the gateway renders with vLLM's own renderer, built from the
replicas' own engine arguments (the model folder, and what an operator adds in ``engine.extra_args``: a
``--chat-template``, its content format, default template options, a tokenizer), and only tokenizes the
text itself (bounded by the context, gateway/tokens.py).

The same arguments say which tool choices the replicas serve: without a tool-call parser, vLLM refuses
every choice but "none" (and "auto" is what a chat with tools asks for by default); the gateway refuses
them first, before the request waits in the queue.

Media are never fetched here. A model without a multimodal config refuses media parts, as vLLM does; for a
multimodal model each media part is rendered as an empty text part, so the count leaves out the media's
placeholders and tokens (an undercount, which completion corrects to what the engine counted). Its replicas
would fetch a media URL from inside the deployment's network on a tenant's word, so unless the replicas'
arguments name the hosts they may fetch from (vLLM's ``--allowed-media-domains``), a media part with an
http(s) URL is a 400 and only data: URLs are taken.
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

from gateway.errors import InvalidValue
from gateway.json_text import strings

logger = logging.getLogger(__name__)


class VllmChatRenderer:
    """vLLM's chat renderer, set up as the replicas' vLLM OpenAI server sets up its own."""

    def __init__(self, engine_args: list[str]) -> None:
        from vllm.config import VllmConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.renderers.chat_utils import load_chat_template
        from vllm.renderers.registry import renderer_from_config
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        args = make_arg_parser(FlexibleArgumentParser()).parse_args(engine_args)
        config = VllmConfig(model_config=AsyncEngineArgs.from_cli_args(args).create_model_config())
        self._renderer = renderer_from_config(config)
        self.multimodal = config.model_config.multimodal_config is not None
        self._template = load_chat_template(args.chat_template)  # as vLLM's init_app_state loads it
        self._content_format = args.chat_template_content_format
        self._default_options = args.default_chat_template_kwargs
        self._exclude_tools_when_none = args.exclude_tools_when_tool_choice_none
        self._media_domains = args.allowed_media_domains  # None: vLLM fetches media from any host
        self._tool_choices = _ToolChoices(args, self._renderer.tokenizer, config.model_config.hf_config.model_type)
        self.render({"messages": [{"role": "user", "content": "warm up"}]})  # resolves and compiles the template

    @property
    def tokenizer(self) -> Any:
        """The tokenizer vLLM renders with (the replicas' ``--tokenizer`` where set), safe to share between
        threads (vLLM keeps a pool of copies behind it)."""
        return self._renderer.tokenizer

    def render(self, body: dict[str, Any]) -> str | list[int]:
        """The prompt of the chat ``body`` (validated): its text, or its token ids where the template's
        options ask vLLM to tokenize. Media parts sent to a text-only model are a 400, as on the replica."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest, ChatCompletionToolsParam
        from vllm.exceptions import VLLMClientError
        from vllm.renderers.chat_utils import has_non_text_content
        from vllm.renderers.params import merge_kwargs

        self._tool_choices.check(body)
        messages = body["messages"]
        if has_non_text_content(messages):
            if not self.multimodal:
                raise InvalidValue(f"messages: {body.get('model') or 'this model'} is not a multimodal model; "
                                   "send text content parts only.", param="messages")
            if self._media_domains is None and _fetches_media(messages):
                raise InvalidValue("messages: a media URL would be fetched by this deployment's replicas, from "
                                   "inside its network, and it names no hosts to fetch from; send media as data: "
                                   "URLs (an operator names the hosts with vLLM's --allowed-media-domains in "
                                   "engine.extra_args).", param="messages")
            messages = [_without_media(message) for message in messages]

        # the chat parameters exactly as vLLM's serving layer builds them (OnlineRenderer.render_chat and
        # preprocess_chat)
        tools = body.get("tools")
        if tools and not (body.get("tool_choice") == "none" and self._exclude_tools_when_none):
            dumped = [ChatCompletionToolsParam.model_validate(tool).model_dump() for tool in tools]
        else:
            dumped = None
        params = ChatCompletionRequest.build_chat_params(_Fields(body, ChatCompletionRequest), self._template,
                                                         self._content_format)
        params = params.with_defaults(merge_kwargs(self._default_options, {"tools": dumped, "tokenize": False}))
        try:
            _, prompt = self._renderer.render_messages(_unshared(messages), params)
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


class _ToolChoices:
    """The tool choices the replicas' vLLM serves. Its serving layer has a tool-call parser only with both
    ``--enable-auto-tool-choice`` and ``--tool-call-parser`` (vLLM's ParserManager.get_tool_parser), and without
    one it refuses every choice but ``"none"`` (OnlineRenderer.render_chat), after the request has waited in
    the queue. ``"auto"`` is the choice of a chat with tools that names none."""

    def __init__(self, args: Any, tokenizer: Any, model_type: str) -> None:
        from vllm.utils.mistral import is_mistral_tokenizer

        # Mistral tokenizers and Harmony models (gpt-oss) parse tool calls without a named parser
        self._parser = (bool(args.enable_auto_tool_choice and args.tool_call_parser)
                        or is_mistral_tokenizer(tokenizer) or model_type == "gpt_oss")

    def check(self, body: dict[str, Any]) -> None:
        """Raise InvalidValue (400) for a tool choice the replicas would refuse."""
        choice = body["tool_choice"] if "tool_choice" in body else ("auto" if body.get("tools") else "none")
        if self._parser or choice in (None, "none"):
            return
        raise InvalidValue(f"tool_choice: {json.dumps(choice)[:200]} needs a tool-call parser, which this "
                           "deployment's replicas do not run (--enable-auto-tool-choice and --tool-call-parser in "
                           'engine.extra_args); "none" is served.', param="tool_choice")


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


def _is_media(part: Any) -> bool:
    # as vLLM tells a media part from a text part
    from vllm.renderers.chat_utils import has_non_text_content

    return has_non_text_content([{"content": [part]}])


def _without_media(message: Any) -> Any:
    # each media part as an empty text part: vLLM would fetch its URL to render it
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return message
    return {**message, "content": [{"type": "text", "text": ""} if _is_media(part) else part for part in content]}


def _fetches_media(messages: list[Any]) -> bool:
    # an http(s) URL anywhere in a media part: what vLLM's replicas would fetch
    return any(_is_media(part) and _holds_url(part)
               for message in messages if isinstance(message, dict) and isinstance(message.get("content"), list)
               for part in message["content"])


def _holds_url(value: Any) -> bool:
    return any(text.lstrip()[:8].lower().startswith(("http://", "https://")) for text in strings(value, keys=False))


def _unshared(messages: list[Any]) -> list[Any]:
    # vLLM parses tool-call arguments into objects in place; the body is forwarded to the replica as sent
    return [{**message, "tool_calls": copy.deepcopy(message["tool_calls"])}
            if isinstance(message, dict) and message.get("tool_calls") else message for message in messages]


def build_chat_renderer(model_path: str, engine_args: list[str] | None = None) -> VllmChatRenderer | None:
    """vLLM's renderer as the replicas started with ``engine_args`` (vLLM CLI arguments; None: the model
    folder's defaults) render, or without the arguments where vLLM cannot read them here (a path only the
    replicas' nodes have); None where vLLM cannot build one at all (logged): the gateway then applies the
    model's template to the messages as sent, an approximation of what the engine renders."""
    tries = [engine_args, ["--model", model_path]] if engine_args else [["--model", model_path]]
    for args in tries:
        try:
            return VllmChatRenderer(args)
        except (Exception, SystemExit) as exc:  # vLLM's parser exits on arguments it does not know
            logger.warning("vLLM's chat renderer could not be built %s (%s: %s)",
                           "with the replicas' engine arguments" if args is engine_args else "for the model",
                           type(exc).__name__, str(exc)[:200])
    logger.warning("chats are counted with the model's template applied to the messages as sent")
    return None
