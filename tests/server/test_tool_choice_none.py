"""tool_choice none on the three APIs: the tools stay in the prompt (the same token ids as
under auto, so an agent's last, tool-less step extends the prompt of its tool steps and reuses
it as an exact prefix), and the reply is text, never parsed into a tool call, streaming or
not."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from agentcache.chat.runner import ChatEngine, ChatRequest
from agentcache.chat.tools import TOOL_CALL_OPEN
from agentcache.model.loading import LoadedModel
from agentcache.runtime import loop as loop_module
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.server.config import ServerLimits
from agentcache.server.convert import to_chat_request
from agentcache.server.messages_api import to_turn
from agentcache.server.messages_schema import MessagesRequest
from agentcache.server.responses import to_chat_request as responses_request
from agentcache.server.responses_schema import ResponsesRequest
from agentcache.server.schemas import ChatCompletionRequest
from agentcache.testing import scripted_sampler
from tests.server.conftest import MODEL

PATH: Any = {"type": "object", "properties": {"path": {"type": "string"}}}
CHAT_LS: Any = {"type": "function", "function": {"name": "ls", "description": "list files",
                                                 "parameters": PATH}}  # fmt: skip
FLAT_LS: Any = {"type": "function", "name": "ls", "description": "list files", "parameters": PATH}
MESSAGES_LS: Any = {"name": "ls", "description": "list files", "input_schema": PATH}
CALL = f'{TOOL_CALL_OPEN}\n{{"name": "ls", "arguments": {{"path": "src"}}}}\n</tool_call>'
USER = "list src"


def _prompt_ids(chat: ChatEngine, request: ChatRequest) -> tuple[int, ...]:
    return chat.prepare(request).tokens.ids


def _requests(choice: str, schema: Any = None) -> list[ChatRequest]:
    """The same conversation with tools under `choice` (auto or none) on each API; with
    `schema`, the reply's format is that JSON Schema."""
    limits = ServerLimits()
    fmt: Any = {} if schema is None else {"response_format": {
        "type": "json_schema", "json_schema": {"name": "r", "schema": schema}}}  # fmt: skip
    body = ChatCompletionRequest.model_validate({
        "model": MODEL, "messages": [{"role": "user", "content": USER}], "tools": [CHAT_LS],
        "tool_choice": choice, **fmt})  # fmt: skip
    chat_req, _ = to_chat_request(body, None, "", 8)
    fmt = {} if schema is None else {"text": {"format": {
        "type": "json_schema", "name": "r", "schema": schema}}}  # fmt: skip
    rbody = ResponsesRequest.model_validate(
        {"model": MODEL, "input": USER, "tools": [FLAT_LS], "tool_choice": choice, **fmt}
    )
    resp_req, _, _ = responses_request(rbody, (), None, "", 8, limits)
    fmt = {} if schema is None else {"output_config": {"format": {
        "type": "json_schema", "schema": schema}}}  # fmt: skip
    mbody = MessagesRequest.model_validate({
        "model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": USER}],
        "tools": [MESSAGES_LS], "tool_choice": {"type": choice}, **fmt})  # fmt: skip
    msg_req = to_turn(mbody, None, "", limits, 3600).request
    return [chat_req, resp_req, msg_req]


def test_the_prompt_under_none_is_the_prompt_under_auto(tiny: LoadedModel) -> None:
    chat = ChatEngine(Engine(tiny, EngineConfig(kv_pages=64)))
    for auto, none in zip(_requests("auto"), _requests("none"), strict=True):
        assert none.tools == auto.tools and len(none.tools) == 1
        assert auto.tool_calls and not none.tool_calls
        assert _prompt_ids(chat, none) == _prompt_ids(chat, auto)
        bare = ChatRequest(none.messages, none.params)  # what none rendered before: no tools
        assert len(_prompt_ids(chat, bare)) < len(_prompt_ids(chat, none))


def test_a_format_under_none_admits_no_call_in_place_of_its_json() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    for auto, none in zip(_requests("auto", schema), _requests("none", schema), strict=True):
        assert auto.output is not None and auto.output.or_call
        assert none.output is not None and not none.output.or_call
        assert none.output.schema == schema


def test_a_chat_reply_under_none_is_text_even_when_it_reads_as_a_call(
    server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(CALL))
    args: Any = {"model": MODEL, "messages": [{"role": "user", "content": USER}],
                 "tools": [CHAT_LS], "max_tokens": 80, "parallel_tool_calls": False}  # fmt: skip
    auto = c.chat.completions.create(**args, tool_choice="auto")  # the same text is a call
    assert auto.choices[0].finish_reason == "tool_calls"
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(CALL))  # its stop left an EOS
    r = c.chat.completions.create(**args, tool_choice="none")
    choice = r.choices[0]
    assert choice.message.tool_calls is None and choice.message.content == CALL
    assert choice.finish_reason == "stop"
    chunks = list(c.chat.completions.create(**args, tool_choice="none", stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert all(d.tool_calls is None for d in deltas)
    assert "".join(d.content or "" for d in deltas) == CALL
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"


def test_a_responses_reply_under_none_is_text(
    server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(CALL))
    args: Any = {"model": MODEL, "input": USER, "tools": [FLAT_LS], "max_output_tokens": 80,
                 "tool_choice": "none", "store": False}  # fmt: skip
    r = c.responses.create(**args)
    assert [o.type for o in r.output] == ["message"]
    assert r.output_text == CALL and r.status == "completed"
    events = list(c.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert not any("function_call" in k for k in kinds) and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == CALL


def test_a_messages_reply_under_none_is_text(
    server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    anthropic = pytest.importorskip("anthropic")
    c = anthropic.Anthropic(base_url=server_url, api_key="unused", max_retries=0)
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(CALL))
    args: Any = {"model": MODEL, "max_tokens": 80, "tools": [MESSAGES_LS],
                 "tool_choice": {"type": "none"},
                 "messages": [{"role": "user", "content": USER}]}  # fmt: skip
    r = c.messages.create(**args)
    assert [(b.type, b.text) for b in r.content] == [("text", CALL)]
    assert r.stop_reason == "end_turn"
    events = list(c.messages.create(**args, stream=True))
    assert not any(getattr(e, "content_block", None) and e.content_block.type == "tool_use"
                   for e in events)  # fmt: skip
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert "".join(d.text for d in deltas) == CALL
    assert [e.delta.stop_reason for e in events if e.type == "message_delta"] == ["end_turn"]


def test_a_last_step_under_none_reuses_the_tool_step_as_an_exact_prefix(
    server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's tool step, then its final step under none (what pydantic-ai's NativeOutput
    sends): the final prompt extends the first, so the first is found whole, exact."""
    url = f"{server_url}/v1/chat/completions"
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(CALL))
    messages: Any = [{"role": "system", "content": "You are a build agent. " * 8},
                     {"role": "user", "content": USER}]  # fmt: skip
    body: Any = {"model": MODEL, "messages": messages, "tools": [CHAT_LS], "max_tokens": 80}
    one = httpx.post(url, json=body).json()
    message = one["choices"][0]["message"]
    assert one["choices"][0]["finish_reason"] == "tool_calls"
    monkeypatch.setattr(loop_module, "sample", scripted_sampler('{"files": 2}'))
    call_id = message["tool_calls"][0]["id"]
    messages = [*messages, message, {"role": "tool", "tool_call_id": call_id, "content": "a b"}]
    two = httpx.post(url, json={**body, "messages": messages, "tool_choice": "none"}).json()
    assert two["choices"][0]["message"]["content"] == '{"files": 2}'
    first = one["usage"]["prompt_tokens"]
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] >= first
    report = two["agentcache"]
    assert report["exact_tokens"] >= first and report["moved_tokens"] == 0
    assert any(s["segment_id"].startswith("__tools__") and s["status"] == "hit"
               for s in report["segments"])  # fmt: skip
