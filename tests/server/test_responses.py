"""POST /v1/responses through the stock `openai` client against a live server: the same
replies and reuse as chat completions, the Responses stream events, function calls, and
previous_response_id state (bounded, tenant-scoped, expiring)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from agentcache.chat.messages import ChatMessage
from agentcache.model.loading import LoadedModel
from agentcache.runtime import loop as loop_module
from agentcache.server.config import key_digest
from agentcache.server.inprocess import serve_in_thread
from agentcache.server.response_store import ResponseStore
from agentcache.testing import scripted_sampler
from tests.server.conftest import MODEL, tiny_app

SYSTEM = "You are a build agent. Tools: ls, cat, grep, make. Reply with one command. " * 3
PATH: Any = {"type": "object", "properties": {"path": {"type": "string"}}}
LS: Any = {"type": "function", "name": "ls", "description": "list files", "parameters": PATH}


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_a_reply_equals_the_chat_completion_of_the_same_messages(server_url: str) -> None:
    c = client(server_url)
    r = c.responses.create(model=MODEL, instructions=SYSTEM, input="list the files",
                           temperature=0, max_output_tokens=8)  # fmt: skip
    chat = c.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=8,
        messages=[{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": "list the files"}],
    )  # fmt: skip
    assert r.output_text == chat.choices[0].message.content
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert r.usage is not None and r.usage.input_tokens == chat.usage.prompt_tokens  # type: ignore[union-attr]
    assert r.id.startswith("resp_") and r.output[0].type == "message"


def test_previous_response_id_continues_and_reuses(server_url: str) -> None:
    c = client(server_url)
    first = c.responses.create(model=MODEL, instructions=SYSTEM, input="list the files",
                               temperature=0, max_output_tokens=6)  # fmt: skip
    second = c.responses.create(model=MODEL, instructions=SYSTEM, input="open the README",
                                previous_response_id=first.id, temperature=0,
                                max_output_tokens=6)  # fmt: skip
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0
    # the same conversation sent whole as items: the same reply
    items: Any = [
        {"role": "user", "content": "list the files"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": first.output_text}]},
        {"role": "user", "content": [{"type": "input_text", "text": "open the README"}]},
    ]  # fmt: skip
    whole = c.responses.create(model=MODEL, instructions=SYSTEM, input=items, temperature=0,
                               max_output_tokens=6, store=False)  # fmt: skip
    assert whole.output_text == second.output_text
    r = httpx.post(f"{server_url}/v1/responses", json={
        "model": MODEL, "input": "x", "previous_response_id": whole.id})  # fmt: skip
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"


def test_the_stream_is_the_responses_event_sequence(server_url: str) -> None:
    c = client(server_url)
    args: Any = {"model": MODEL, "input": "write something", "temperature": 0,
                 "max_output_tokens": 12}  # fmt: skip
    whole = c.responses.create(**args)
    events = list(c.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    last = events[-1].response
    assert last.output_text == whole.output_text and last.usage is not None


def test_function_calls_round_trip(server_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    c = client(server_url)
    monkeypatch.setattr(loop_module, "sample", scripted_sampler('{"path": "src"}}\n</tool_call>'))
    args: Any = {"model": MODEL, "input": "list src", "tools": [LS], "max_output_tokens": 40,
                 "tool_choice": {"type": "function", "name": "ls"}}  # fmt: skip
    r = c.responses.create(**args)
    calls = [o for o in r.output if o.type == "function_call"]
    assert [(o.name, o.arguments) for o in calls] == [("ls", '{"path": "src"}')]
    assert r.status == "completed"
    events = list(c.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in done] == ['{"path": "src"}']
    monkeypatch.setattr(loop_module, "sample", scripted_sampler("done"))
    follow: Any = [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "a b"}]
    nxt = c.responses.create(model=MODEL, input=follow, previous_response_id=r.id,
                             tools=[LS], max_output_tokens=8)  # fmt: skip
    assert nxt.output_text == "done"
    assert nxt.usage is not None and nxt.usage.input_tokens_details.cached_tokens > 0


def responses_loop(url: str, turns: int = 4) -> list[Any]:
    """An agent on the Responses API: each step sends only its new input."""
    c, replies, previous = client(url), [], None
    for turn in range(turns):
        r = c.responses.create(model=MODEL, instructions=SYSTEM, input=f"step {turn}: go on",
                               previous_response_id=previous, temperature=0,
                               max_output_tokens=8)  # fmt: skip
        replies.append(r)
        previous = r.id
    return replies


def test_a_responses_conversation_reuses_and_matches_full(tiny: LoadedModel) -> None:
    with serve_in_thread(tiny_app(tiny)) as url:
        reused = responses_loop(url)
    with serve_in_thread(tiny_app(tiny, "full")) as url:
        full = responses_loop(url)
    assert [r.output_text for r in reused] == [r.output_text for r in full]
    cached = [r.usage.input_tokens_details.cached_tokens for r in reused]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    assert all(r.usage.input_tokens_details.cached_tokens == 0 for r in full)


def test_another_tenants_response_id_is_not_found(tiny: LoadedModel) -> None:
    keys = ("key-a", "key-b")
    app = tiny_app(tiny, api_key_digests=frozenset(key_digest(k) for k in keys))
    with serve_in_thread(app) as url:
        a, b = client(url, keys[0]), client(url, keys[1])
        r = a.responses.create(model=MODEL, input="secret plan", max_output_tokens=2)
        with pytest.raises(openai.NotFoundError) as e:
            b.responses.create(model=MODEL, input="go on", previous_response_id=r.id,
                               max_output_tokens=2)  # fmt: skip
        assert "secret" not in str(e.value)
        assert a.responses.create(model=MODEL, input="go on", previous_response_id=r.id,
                                  max_output_tokens=2).status  # fmt: skip


def test_the_store_is_bounded_and_expires() -> None:
    now = [0.0]
    store = ResponseStore(max_responses=2, max_bytes=400, ttl_s=10, clock=lambda: now[0])
    m = (ChatMessage("user", "x" * 100),)
    assert store.put("a", "t", m, "c") and store.put("b", "t", m, "c")
    assert store.put("c", "t", m, "c") and store.get("a", "t") is None  # oldest out
    assert store.get("b", "t") is not None and store.get("b", "other") is None
    assert not store.put("big", "t", (ChatMessage("user", "x" * 500),), "c")
    now[0] = 11.0
    assert store.get("c", "t") is None and len(store) == 0 and store.nbytes == 0
    assert not ResponseStore(0, 400, 10).put("a", "t", m, "c")  # --stored-responses 0
