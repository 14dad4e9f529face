"""A chat is counted as vLLM prepares it for its template (gateway/chat_rendering.py), not as the client sent
it: list content against a string template, ``content: null`` beside tool calls, tool-call arguments, tool
results in parts and tools as vLLM's protocol dumps them. Each expectation below writes vLLM's preparation out
by hand, so a count of the raw messages fails it."""

import copy
import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from gateway import chat_rendering
from gateway.errors import InvalidValue
from gateway.request_parsing import parse_request
from gateway.tokens import PromptTokenCounter

STRING_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
                   "message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
                   "{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def counter(tiny_model_path: Path) -> PromptTokenCounter:
    return PromptTokenCounter(str(tiny_model_path))


def _count(counter: PromptTokenCounter, body: dict) -> int:
    [tokens] = counter.count(parse_request(json.dumps({"model": "m", **body}).encode(), "chat"))
    return tokens


def _template_tokens(counter: PromptTokenCounter, messages: list[dict], **options: Any) -> int:
    return len(counter.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False,
                                                     add_generation_prompt=True, **options))


def test_an_agent_turn_is_counted_as_vllm_prepares_it(counter: PromptTokenCounter) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    body = {"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},  # the template iterates no content parts
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"},
                                                           {"type": "text", "text": "20C"}]},
    ]}
    sent = copy.deepcopy(body)
    prepared = [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": [], "tool_calls": [
            {**call, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny\n20C"},
    ]
    assert _count(counter, body) == _template_tokens(counter, prepared)
    assert body == sent  # forwarded to the replica as the client sent it


def test_tools_are_counted_as_vllms_protocol_dumps_them(counter: PromptTokenCounter) -> None:
    # a tool without a description renders with "description": null on the replica: 95 tokens there, 84 when
    # the raw tools were rendered
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "weather?"}]
    dumped = [{"type": "function", "function": {"name": "f", "description": None, "parameters": {"type": "object"}}}]
    counted = _count(counter, {"messages": messages, "tools": [tool], "tool_choice": "none"})
    assert counted == _template_tokens(counter, messages, tools=dumped)
    assert counted > _template_tokens(counter, messages, tools=[tool])


def test_a_string_template_sees_text_parts_joined_by_newlines(tiny_model_path: Path, tmp_path: Path) -> None:
    model = tmp_path / "string-template-model"
    shutil.copytree(tiny_model_path, model)
    (model / "chat_template.jinja").write_text(STRING_TEMPLATE)
    counter = PromptTokenCounter(str(model))
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]
    assert _count(counter, {"messages": [{"role": "user", "content": parts}]}) == \
        _template_tokens(counter, [{"role": "user", "content": "hello\nworld"}])


def test_the_replicas_chat_template_and_content_format_are_the_gateways(tiny_model_path: Path,
                                                                          tmp_path: Path) -> None:
    # an operator's --chat-template in engine.extra_args reaches the replicas' vLLM and the gateway's count
    template = tmp_path / "string.jinja"
    template.write_text(STRING_TEMPLATE)
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"},
                                                       {"type": "text", "text": "world"}]}]}
    joined = [{"role": "user", "content": "hello\nworld"}]
    model = str(tiny_model_path)
    with_template = PromptTokenCounter(model, ["--model", model, "--chat-template", str(template)])
    assert _count(with_template, parts) == len(with_template.tokenizer.apply_chat_template(
        joined, chat_template=STRING_TEMPLATE, tokenize=True, return_dict=False, add_generation_prompt=True))
    # the model's own template reads lists; a content format forced to "string" joins the parts all the same
    forced = PromptTokenCounter(model, ["--model", model, "--chat-template-content-format", "string"])
    own = PromptTokenCounter(model)
    assert _count(forced, parts) == _template_tokens(forced, joined) != _count(own, parts)


def test_engine_arguments_vllm_cannot_read_here_fall_back_to_the_model_folder(tiny_model_path: Path,
                                                                            tmp_path: Path) -> None:
    # a template path only the replicas' nodes have: the gateway renders with the model's own template
    model = str(tiny_model_path)
    counter = PromptTokenCounter(model, ["--model", model, "--chat-template", str(tmp_path / "absent.jinja")])
    assert counter._chat_renderer is not None
    agent = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}
    assert _count(counter, agent) == _count(PromptTokenCounter(model), agent)


@pytest.fixture
def media_url() -> Iterator[tuple[str, list[str]]]:
    """A picture's URL on a local server, and the paths fetched from it: the gateway must fetch none."""
    fetched: list[str] = []

    class Recorder(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            fetched.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/picture.png", fetched
    server.shutdown()


def _with_picture(url: str) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                                      {"type": "image_url", "image_url": {"url": url}}]}]}


def test_media_for_a_text_only_model_is_a_400_and_never_fetched(counter: PromptTokenCounter,
                                                                media_url: tuple[str, list[str]]) -> None:
    url, fetched = media_url
    with pytest.raises(InvalidValue) as caught:
        _count(counter, _with_picture(url))
    assert caught.value.param == "messages" and "not a multimodal model" in caught.value.message
    assert fetched == []


def test_without_vllms_renderer_the_template_sees_the_messages_as_sent(tiny_model_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def unreadable(model_path: str) -> None:
        raise ValueError("this model needs trust_remote_code")

    monkeypatch.setattr(chat_rendering, "VllmChatRenderer", unreadable)
    counter = PromptTokenCounter(str(tiny_model_path))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "weather?"}]
    assert _count(counter, {"messages": messages, "tools": [tool]}) == \
        _template_tokens(counter, messages, tools=[tool])


def test_a_vllm_whose_chat_parameters_read_more_than_fields_is_not_used(tiny_model_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The request's fields are read without validating again; a vLLM that reads anything else fails the
    renderer's warm-up at start, so the gateway falls back instead of answering every chat with a 400."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    def reads_a_method(self: Any, template: Any, content_format: Any) -> Any:
        return self.some_helper()

    monkeypatch.setattr(ChatCompletionRequest, "build_chat_params", reads_a_method)
    assert chat_rendering.build_chat_renderer(str(tiny_model_path)) is None


def test_media_for_a_multimodal_model_are_counted_without_being_fetched(tiny_model_path: Path,
                                                                        media_url: tuple[str, list[str]],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    model = str(tiny_model_path)
    counter = PromptTokenCounter(model, ["--model", model, "--allowed-media-domains", "127.0.0.1", "example.com"])
    # the tiny model is text-only: its renderer is told otherwise, which is all the gateway reads of it
    monkeypatch.setattr(counter._chat_renderer, "multimodal", True)
    url, fetched = media_url
    body = _with_picture(url)
    sent = copy.deepcopy(body)
    counted = _count(counter, body)
    assert fetched == [] and body == sent
    assert counted == _template_tokens(counter, [{"role": "user", "content": "what is this?"}])  # the text only


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "URL"}},
    {"type": "image_url", "image_url": {"url": " HTTPS://169.254.169.254/latest/meta-data"}},
    {"type": "audio_url", "audio_url": {"url": "URL"}},
    {"type": "video_url", "video_url": {"url": "URL", "detail": "low"}},
])
def test_a_media_url_is_refused_unless_the_replicas_name_the_hosts_they_fetch_from(
        counter: PromptTokenCounter, media_url: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch,
        part: dict) -> None:
    """vLLM's replicas fetch a media URL from inside the deployment's network: with no --allowed-media-domains
    a tenant could make them call any internal address, so only data: URLs are taken."""
    monkeypatch.setattr(counter._chat_renderer, "multimodal", True)
    url, fetched = media_url
    chat = [{"type": "text", "text": "what is this?"}, json.loads(json.dumps(part).replace("URL", url))]
    with pytest.raises(InvalidValue) as caught:
        _count(counter, {"messages": [{"role": "user", "content": chat}]})
    assert caught.value.param == "messages" and "--allowed-media-domains" in caught.value.message
    assert fetched == []
    inline = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    assert _count(counter, {"messages": [{"role": "user", "content": [chat[0], inline]}]}) > 0


@pytest.mark.parametrize(("choice", "refused"), [
    (None, True),  # a chat with tools that names no choice asks for "auto"
    ("auto", True), ("required", True), ({"type": "function", "function": {"name": "f"}}, True),
    ("none", False),
])
def test_a_tool_choice_the_replicas_cannot_parse_is_refused_before_the_queue(counter: PromptTokenCounter,
                                                                             choice: Any, refused: bool) -> None:
    body = {"messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
    if choice is not None:
        body["tool_choice"] = choice
    if not refused:
        assert _count(counter, body) > 0
        return
    with pytest.raises(InvalidValue) as caught:
        _count(counter, body)
    assert caught.value.param == "tool_choice" and "--tool-call-parser" in caught.value.message


def test_replicas_with_a_tool_call_parser_take_every_tool_choice(tiny_model_path: Path) -> None:
    model = str(tiny_model_path)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    bodies = [{"messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": choice}
              for choice in ("auto", "required", {"type": "function", "function": {"name": "f"}})]
    parsing = PromptTokenCounter(model, ["--model", model, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    assert all(_count(parsing, body) > 0 for body in bodies)
    # vLLM's serving layer uses a named parser only with --enable-auto-tool-choice
    named_only = PromptTokenCounter(model, ["--model", model, "--tool-call-parser", "hermes"])
    for body in bodies:
        with pytest.raises(InvalidValue):
            _count(named_only, body)


def test_the_local_config_serves_an_agents_default_tool_choice(tiny_model_path: Path) -> None:
    """The shipped local config runs a tool-call parser, so a chat with tools and no tool choice (what agent
    clients send: "auto") is counted and queued, not refused for want of a parser."""
    import yaml

    from gateway.config import AppConfig

    args = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy" / "local.yaml").read_text())
    config = AppConfig.model_validate(args["applications"][0]["args"])
    config.model.path = str(tiny_model_path)
    counter = PromptTokenCounter(config.model.path, config.replica_engine_args())
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    assert _count(counter, {"messages": [{"role": "user", "content": "find 42"}], "tools": tools}) > 0
