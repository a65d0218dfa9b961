"""A tool call the server generated is found when the client sends it back with the tool's
result, whether the model chose to call (tool_choice auto) or the request forced the call (a
named tool, or any tool: the reply then starts with the call's opening as a prefill), on chat
completions, Responses (function_call items) and Messages (tool_use blocks): the assistant
message's every token is an exact hit, none computed. So is a continued Messages reply."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentcache.chat.messages import ToolCall
from agentcache.chat.tools import forced_call_prefix, format_tool_call
from agentcache.model.loading import LoadedModel
from agentcache.runtime import loop as loop_module
from agentcache.testing import scripted_sampler
from tests.server.conftest import MODEL, tiny_app

PATH: Any = {"type": "object", "properties": {"path": {"type": "string"}}}
SYSTEM = "You are a build agent. Call a tool to look at the files before you answer."
# the request's tool_choice on each API, and the prefill it starts the reply with
CHOICES: dict[str, tuple[Any, Any, Any, str | None]] = {
    # case: (chat completions, Responses, Messages, prefill)
    "auto": ("auto", "auto", {"type": "auto"}, None),
    "named": ({"type": "function", "function": {"name": "ls"}}, {"type": "function", "name": "ls"},
              {"type": "tool", "name": "ls"}, forced_call_prefix("ls")),
    "any of two": ("required", "required", {"type": "any"}, forced_call_prefix(None)),
}  # fmt: skip


def tools(api: str, case: str) -> list[Any]:
    names = ["ls", "cat"] if case == "any of two" else ["ls"]
    if api == "chat":
        return [{"type": "function", "function": {"name": n, "parameters": PATH}} for n in names]
    if api == "responses":
        return [{"type": "function", "name": n, "parameters": PATH} for n in names]
    return [{"name": n, "input_schema": PATH} for n in names]


@pytest.fixture(scope="module")
def client(tiny: LoadedModel) -> Iterator[TestClient]:
    with TestClient(tiny_app(tiny, kv_pages=512)) as c:
        yield c


def script(monkeypatch: pytest.MonkeyPatch, case: str, path: str) -> str:
    """The model writes the call (of ls on `path`) after the prefill (the tiny model's byte
    tokenizer spells any text; a random model's own output would not be a call). Each test
    calls on its own path: its message is stored by no other test."""
    call = format_tool_call(ToolCall("c", "ls", {"path": path}))
    prefill = CHOICES[case][3] or ""
    assert call.startswith(prefill)
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(call[len(prefill) :]))
    return call


def post(client: TestClient, path: str, body: Any) -> Any:
    r = client.post(path, json={"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def sent_back(report: Any) -> Any:
    """The one assistant message of the second request: the call sent back."""
    (seg,) = [s for s in report["segments"] if s["role"] == "assistant" and s["kind"] == "fixed"]
    return seg


def check_found(report: Any, call: str) -> None:
    seg = sent_back(report)
    assert (seg["status"], seg["reason"]) == ("hit", None), seg
    assert seg["exact_tokens"] == seg["num_tokens"] > len(call)  # its bytes and markup
    assert report["reused_tokens"] >= seg["num_tokens"]


@pytest.mark.parametrize("case", CHOICES)
def test_chat_completions(client: TestClient, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    path = f"src/chat/{case}"
    call = script(monkeypatch, case, path)
    ts = tools("chat", case)
    messages: list[Any] = [{"role": "system", "content": SYSTEM},
                           {"role": "user", "content": f"list {path}"}]  # fmt: skip
    first = post(
        client,
        "/v1/chat/completions",
        {"messages": messages, "tools": ts, "tool_choice": CHOICES[case][0], "max_tokens": 128},
    )
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    fn = choice["message"]["tool_calls"][0]
    assert (fn["function"]["name"], fn["function"]["arguments"]) == (
        "ls",
        json.dumps({"path": path}),
    )
    monkeypatch.setattr(loop_module, "sample", scripted_sampler("Two files."))
    messages += [choice["message"], {"role": "tool", "tool_call_id": fn["id"], "content": "a b"}]
    second = post(client, "/v1/chat/completions",
                  {"messages": messages, "tools": ts, "max_tokens": 16})  # fmt: skip
    check_found(second["agentcache"], call)


@pytest.mark.parametrize("case", CHOICES)
def test_responses(client: TestClient, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    path = f"src/responses/{case}"
    call = script(monkeypatch, case, path)
    ts = tools("responses", case)
    user = {"role": "user", "content": f"list {path}"}
    first = post(client, "/v1/responses", {"instructions": SYSTEM, "input": [user], "tools": ts,
                 "tool_choice": CHOICES[case][1], "max_output_tokens": 128})  # fmt: skip
    calls = [o for o in first["output"] if o["type"] == "function_call"]
    assert [(o["name"], o["arguments"]) for o in calls] == [("ls", json.dumps({"path": path}))]
    monkeypatch.setattr(loop_module, "sample", scripted_sampler("Two files."))
    result = {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "a b"}
    second = post(client, "/v1/responses", {"instructions": SYSTEM, "tools": ts,
                  "input": [user, *calls, result], "max_output_tokens": 16})  # fmt: skip
    check_found(second["agentcache"], call)


@pytest.mark.parametrize("case", CHOICES)
def test_messages(client: TestClient, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    path = f"src/messages/{case}"
    call = script(monkeypatch, case, path)
    ts = tools("messages", case)
    history: list[Any] = [{"role": "user", "content": f"list {path}"}]
    first = post(client, "/v1/messages", {"system": SYSTEM, "messages": history, "tools": ts,
                 "tool_choice": CHOICES[case][2], "max_tokens": 128})  # fmt: skip
    uses = [b for b in first["content"] if b["type"] == "tool_use"]
    assert [(b["name"], b["input"]) for b in uses] == [("ls", {"path": path})]
    monkeypatch.setattr(loop_module, "sample", scripted_sampler("Two files."))
    history += [{"role": "assistant", "content": first["content"]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0]["id"],
                                              "content": "a b"}]}]  # fmt: skip
    second = post(client, "/v1/messages", {"system": SYSTEM, "messages": history, "tools": ts,
                  "max_tokens": 16})  # fmt: skip
    check_found(second["agentcache"], call)


def test_a_continued_messages_reply_is_found_whole(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages continues a last assistant message (its text the reply's prefill); the message
    sent back next, the client's start and the reply in one, is found as one stored message."""
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(" world, from the cache"))
    history: list[Any] = [{"role": "user", "content": "say hello world, from the cache"},
                          {"role": "assistant", "content": "hello"}]  # fmt: skip
    first = post(client, "/v1/messages", {"system": SYSTEM, "messages": history, "max_tokens": 64})
    assert first["content"][0]["text"] == " world, from the cache"
    history[-1] = {"role": "assistant", "content": "hello world, from the cache"}
    history.append({"role": "user", "content": "again"})
    second = post(client, "/v1/messages", {"system": SYSTEM, "messages": history, "max_tokens": 4})
    check_found(second["agentcache"], "hello world, from the cache")
