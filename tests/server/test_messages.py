"""POST /v1/messages through the official `anthropic` client against a live server: the same
replies and reuse as chat completions, the Messages stream events, tool_use / tool_result
round trips, cache_control and its usage fields, API keys in `x-api-key`."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from agentcache.model.loading import LoadedModel
from agentcache.runtime import loop as loop_module
from agentcache.server.config import key_digest
from agentcache.server.inprocess import serve_in_thread
from agentcache.testing import scripted_sampler
from tests.server.conftest import MODEL, tiny_app

anthropic = pytest.importorskip("anthropic")

SYSTEM = "You are a build agent. Tools: ls, cat, grep, make. Reply with one command. " * 3
PATH: Any = {"type": "object", "properties": {"path": {"type": "string"}}}
LS: Any = {"name": "ls", "description": "list files", "input_schema": PATH}
EPHEMERAL: Any = {"type": "ephemeral"}
T0: Any = {"temperature": 0}  # the SDK has no temperature argument; the API takes it


def client(url: str, key: str = "unused") -> Any:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)


def test_a_reply_equals_the_chat_completion_of_the_same_messages(server_url: str) -> None:
    m = client(server_url).messages.create(
        model=MODEL, system=SYSTEM, max_tokens=8, extra_body=T0,
        messages=[{"role": "user", "content": "list the files"}],
    )  # fmt: skip
    chat = httpx.post(f"{server_url}/v1/chat/completions", json={
        "model": MODEL, "temperature": 0, "max_tokens": 8,
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": "list the files"}]}).json()  # fmt: skip
    assert m.content[0].type == "text"
    assert m.content[0].text == chat["choices"][0]["message"]["content"]
    finish = chat["choices"][0]["finish_reason"]
    assert m.stop_reason == ("max_tokens" if finish == "length" else "end_turn")
    u = m.usage
    total = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    assert total == chat["usage"]["prompt_tokens"] and m.id.startswith("msg_")


def conversation(url: str, turns: int = 4, cache: bool = True) -> list[Any]:
    """An agent on the Messages API resending its whole history each step, a breakpoint on the
    system prompt and on the last user block."""
    c, history, replies = client(url), [], []
    system: Any = [{"type": "text", "text": SYSTEM, **({"cache_control": EPHEMERAL} if cache
                                                     else {})}]  # fmt: skip
    for turn in range(turns):
        block: Any = {"type": "text", "text": f"step {turn}: go on"}
        if cache:
            block["cache_control"] = {"type": "ephemeral", "ttl": "5m"}
        history.append({"role": "user", "content": [block]})
        r = c.messages.create(model=MODEL, system=system, messages=history, max_tokens=8,
                              extra_body=T0)  # fmt: skip
        replies.append(r)
        history[-1] = {"role": "user", "content": block["text"]}
        history.append({"role": "assistant", "content": r.content[0].text or "ok"})
    return replies


def test_a_messages_conversation_reuses_and_matches_full(tiny: LoadedModel) -> None:
    with serve_in_thread(tiny_app(tiny)) as url:
        reused = conversation(url)
    with serve_in_thread(tiny_app(tiny, "full")) as url:
        full = conversation(url)
    assert [r.content[0].text for r in reused] == [r.content[0].text for r in full]
    read = [r.usage.cache_read_input_tokens for r in reused]
    assert read[0] == 0 and all(n > 0 for n in read[1:])
    assert all(r.usage.cache_read_input_tokens == 0 for r in full)
    assert reused[0].usage.cache_creation_input_tokens > 0
    report = reused[1].model_extra["agentcache"]
    kept = report["cache_control"]
    asked = {k: kept[k] for k in ("breakpoints", "requested_ttl_s", "granted_ttl_s")}
    assert asked == {"breakpoints": 2, "requested_ttl_s": 300, "granted_ttl_s": 300}
    # the ttl is enforced: the turn's segments are pinned in the store for it
    assert kept["enforced"] and kept["retention_source"] == "request"
    assert kept["retained_ttl_s"] == 300 and kept["pinned_segments"] > 0


def test_cache_control_does_not_change_the_reply(server_url: str) -> None:
    marked = conversation(server_url, turns=2, cache=True)
    plain = conversation(server_url, turns=2, cache=False)
    assert [r.content[0].text for r in marked] == [r.content[0].text for r in plain]


def test_a_ttl_is_granted_up_to_the_servers_cap(tiny: LoadedModel) -> None:
    with serve_in_thread(tiny_app(tiny, max_retention_s=600)) as url:
        r = client(url).messages.create(
            model=MODEL, max_tokens=2, cache_control={"type": "ephemeral", "ttl": "1h"},
            messages=[{"role": "user", "content": "hi"}],
        )  # fmt: skip
    kept = r.model_extra["agentcache"]["cache_control"]
    assert (kept["requested_ttl_s"], kept["granted_ttl_s"]) == (3600, 600)


def test_the_stream_is_the_messages_event_sequence(server_url: str) -> None:
    c = client(server_url)
    args: Any = {"model": MODEL, "max_tokens": 12, "extra_body": T0,
                 "messages": [{"role": "user", "content": "write something"}]}  # fmt: skip
    whole = c.messages.create(**args)
    events = list(c.messages.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == whole.content[0].text
    with c.messages.stream(**args) as s:
        final = s.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason

    def total(u: Any) -> int:
        return u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens

    assert total(final.usage) == total(whole.usage)
    assert final.usage.cache_read_input_tokens > 0  # the third request of the same prompt


def test_tool_use_round_trips(server_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    c = client(server_url)
    monkeypatch.setattr(loop_module, "sample", scripted_sampler('{"path": "src"}}\n</tool_call>'))
    args: Any = {"model": MODEL, "max_tokens": 40, "tools": [{**LS, "cache_control": EPHEMERAL}],
                 "tool_choice": {"type": "tool", "name": "ls"},
                 "messages": [{"role": "user", "content": "list src"}]}  # fmt: skip
    r = c.messages.create(**args)
    uses = [b for b in r.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in uses] == [("ls", {"path": "src"})]
    assert r.stop_reason == "tool_use"
    with c.messages.stream(**args) as s:
        final = s.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        ("ls", {"path": "src"})
    ]
    monkeypatch.setattr(loop_module, "sample", scripted_sampler("done"))
    history: Any = [
        {"role": "user", "content": "list src"},
        {"role": "assistant", "content": [b.model_dump() for b in r.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": "a b"}]},
    ]  # fmt: skip
    nxt = c.messages.create(model=MODEL, max_tokens=8, tools=[LS], messages=history)
    assert nxt.content[0].text == "done" and nxt.stop_reason == "end_turn"
    assert nxt.usage.cache_read_input_tokens > 0


def test_a_last_assistant_message_is_continued(server_url: str, monkeypatch: Any) -> None:
    c = client(server_url)
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(" world"))
    messages: Any = [{"role": "user", "content": "say hello world"},
                     {"role": "assistant", "content": "hello"}]  # fmt: skip
    r = c.messages.create(model=MODEL, max_tokens=8, messages=messages)
    assert r.content[0].text == " world"
    events = list(c.messages.create(model=MODEL, max_tokens=8, messages=messages, stream=True))
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == " world"


def test_a_stop_sequence_is_reported(server_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_module, "sample", scripted_sampler("one. two. three"))
    r = client(server_url).messages.create(
        model=MODEL, max_tokens=20, stop_sequences=["two"],
        messages=[{"role": "user", "content": "count"}],
    )  # fmt: skip
    assert (r.stop_reason, r.stop_sequence, r.content[0].text) == ("stop_sequence", "two",
                                                                   "one. ")  # fmt: skip


def test_x_api_key_names_the_tenant(tiny: LoadedModel) -> None:
    keys = ("key-a", "key-b")
    app = tiny_app(tiny, api_key_digests=frozenset(key_digest(k) for k in keys))
    args: Any = {"model": MODEL, "max_tokens": 2, "system": SYSTEM,
                 "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    with serve_in_thread(app) as url:
        client(url, keys[0]).messages.create(**args)
        again = client(url, keys[0]).messages.create(**args)
        other = client(url, keys[1]).messages.create(**args)
        with pytest.raises(anthropic.AuthenticationError) as e:
            client(url, "wrong").messages.create(**args)
    assert again.usage.cache_read_input_tokens > 0
    assert other.usage.cache_read_input_tokens == 0  # nothing shared across tenants
    assert e.value.body["error"]["type"] == "authentication_error"


def test_errors_come_in_the_apis_shape(server_url: str) -> None:
    c = client(server_url)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(
            model=MODEL,
            max_tokens=2,
            messages=[
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}
            ],
        )
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "messages.0.content.0.tool_use_id" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        c.messages.create(
            model="claude-9", max_tokens=2, messages=[{"role": "user", "content": "x"}]
        )
