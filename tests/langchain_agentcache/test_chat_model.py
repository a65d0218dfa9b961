"""ChatAgentCache on a tiny model: reuse across calls, streaming, tools, an agent end to end."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from pydantic import BaseModel, ValidationError

from agentcache.errors import PromptError, UnknownStrategyError
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig
from langchain_agentcache import ChatAgentCache

SYSTEM = "You are a lookup agent. Answer with one short line. " * 3


def make(model: LoadedModel, **kw: object) -> ChatAgentCache:
    engine = Engine(model, EngineConfig(kv_pages=256))
    return ChatAgentCache(**{"model": "tiny", "engine": engine, "max_tokens": 8, **kw})


def conversation(chat: ChatAgentCache, turns: int = 3) -> list[AIMessage]:
    messages: list[BaseMessage] = [SystemMessage(SYSTEM)]
    replies = []
    for t in range(turns):
        messages.append(HumanMessage(f"question {t}: where is file {t}?"))
        reply = chat.invoke(messages)
        assert isinstance(reply, AIMessage)
        replies.append(reply)
        messages.append(reply)
    return replies


def test_later_calls_reuse_and_match_full_recompute(tiny: LoadedModel) -> None:
    replies = conversation(make(tiny))
    reference = conversation(make(tiny, strategy="full"))
    assert [r.content for r in replies] == [r.content for r in reference]
    cache_read = [r.usage_metadata["input_token_details"]["cache_read"] for r in replies]  # type: ignore[index]
    assert cache_read[0] == 0 and all(c > 0 for c in cache_read[1:])
    last = replies[-1].response_metadata
    assert last["model_name"] == "tiny"
    assert last["agentcache"]["reused_tokens"] == cache_read[-1]
    misses = [s for s in last["agentcache"]["segments"] if s["status"] == "new"]
    assert [(s["role"], s["reason"]) for s in misses] == [("assistant", "new"), ("user", "new")]
    usage = replies[-1].usage_metadata
    assert usage is not None and usage["input_tokens"] == last["agentcache"]["prompt_tokens"]


def test_stream_yields_pieces_that_add_up_to_invoke(tiny: LoadedModel) -> None:
    messages = [SystemMessage(SYSTEM), HumanMessage("hello")]
    whole = make(tiny, max_tokens=16).invoke(messages)
    chunks = list(make(tiny, max_tokens=16).stream(messages))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert len(chunks) >= 2  # content arrives before the end, not in one piece
    merged = chunks[0]
    for c in chunks[1:]:
        merged += c  # type: ignore[assignment]
    assert merged.content == whole.content
    assert merged.usage_metadata == whole.usage_metadata
    assert merged.response_metadata["model_name"] == "tiny"
    assert merged.response_metadata["agentcache"]["prompt_tokens"] > 0


class Lookup(BaseModel):
    """Look a word up."""

    word: str


def test_bind_tools_forced_choice_prefills_the_call(tiny: LoadedModel) -> None:
    chat = make(tiny).bind_tools([Lookup], tool_choice="Lookup")
    reply = chat.invoke([HumanMessage("look up 'cache'")])
    segments = reply.response_metadata["agentcache"]["segments"]
    assert segments[0]["segment_id"].startswith("__tools__")
    assert segments[-1]["reason"] == "prefill"
    # a random tiny model does not finish the JSON: the call is reported invalid, not invented
    assert reply.tool_calls == [] and len(reply.invalid_tool_calls) == 1
    assert reply.invalid_tool_calls[0]["args"].startswith('{"name": "Lookup", "arguments": ')


def test_tool_choice_none_keeps_the_tools_in_the_prompt_and_parses_no_call(
    tiny: LoadedModel,
) -> None:
    # as the server does: the prompt under "none" is the prompt under "auto" (the tools block
    # stays, so the next step extends the one before), and the reply is text, never a call
    none = make(tiny).bind_tools([Lookup], tool_choice="none")
    auto = make(tiny).bind_tools([Lookup], tool_choice="auto")
    ask = [HumanMessage("look up 'cache'")]
    for chat in (none, auto):
        segments = chat.invoke(ask).response_metadata["agentcache"]["segments"]
        assert segments[0]["segment_id"].startswith("__tools__")
    model = make(tiny)
    request, _ = model._request(ask, None, {"tools": none.kwargs["tools"], "tool_choice": "none"})
    assert request.tools and request.tool_calls is False


def test_bind_tools_rejects_a_schema_that_is_not_json_schema(tiny: LoadedModel) -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}
    with pytest.raises(PromptError, match="objekt"):
        make(tiny).bind_tools([bad])


@tool
def get_weather(city: str) -> str:
    """Current weather of a city."""
    return f"{city}: 18C, light rain"


def scripted_first_call(messages: Sequence[BaseMessage]) -> str | None:
    """TEST INPUT: a tiny random model cannot decide to call a tool, so the first reply is
    started with a complete call; the engine still runs, reuses and reports for real."""
    if any(isinstance(m, ToolMessage) for m in messages):
        return None
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def test_create_agent_runs_a_tool_end_to_end(tiny: LoadedModel) -> None:
    from langchain.agents import create_agent

    chat = make(tiny, assistant_prefill=scripted_first_call)
    agent = create_agent(chat, tools=[get_weather], system_prompt=SYSTEM)
    state = agent.invoke({"messages": [HumanMessage("What is the weather in Paris?")]})
    messages = state["messages"]
    kinds = [type(m).__name__ for m in messages]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    call = messages[1].tool_calls[0]
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"})
    assert messages[2].content == "Paris: 18C, light rain"
    assert messages[2].tool_call_id == call["id"]
    final = messages[3].response_metadata["agentcache"]
    # second call: system + tools + the question were seen in the first call and reused
    assert final["reused_tokens"] > 0
    statuses = {s["segment_id"][:9]: s["status"] for s in final["segments"]}
    assert statuses["__tools__"] == "hit"


def test_structured_output_reports_a_parse_failure_instead_of_inventing(
    tiny: LoadedModel,
) -> None:
    structured = make(tiny).with_structured_output(Lookup, include_raw=True)
    out = structured.invoke([HumanMessage("look up 'cache'")])
    assert isinstance(out, dict)
    assert out["parsed"] is None  # the random model does not complete the JSON
    assert out["raw"].invalid_tool_calls
    assert out["raw"].response_metadata["agentcache"]["segments"][-1]["reason"] == "prefill"


def test_a_stop_string_is_one_stop_not_its_characters(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentcache.runtime import loop as loop_module
    from agentcache.testing import scripted_sampler

    monkeypatch.setattr(loop_module, "sample", scripted_sampler("say hello world"))
    reply = make(tiny, max_tokens=32).invoke([HumanMessage("hi")], stop="lo w")  # type: ignore[arg-type]
    assert reply.content == "say hel"  # not "say", cut at " " as if each character stopped it
    assert reply.response_metadata["finish_reason"] == "stop"


def test_unknown_strategy_fails_when_the_model_is_made(tiny: LoadedModel) -> None:
    with pytest.raises(UnknownStrategyError, match="unknown reuse strategy 'nope'; known: "):
        make(tiny, strategy="nope")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"temperature": -1}, "temperature must be a finite number >= 0"),
        ({"max_tokens": -3}, "max_new_tokens must be an integer >= 0, got -3"),
        ({"seed": 2**70}, "seed must be None or an integer"),
        ({"stop": ["ok", ""]}, "stop strings must be non-empty strings"),
    ],
)
def test_bad_generation_settings_fail_when_the_model_is_made(
    tiny: LoadedModel, kw: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        make(tiny, **kw)


def test_the_model_echoes_its_conversation_token(tiny: LoadedModel) -> None:
    """An agent that rewrites an earlier message (its memory) does not extend its last request
    verbatim; the token the model echoes keeps it one conversation, its history reused."""
    chat = make(tiny)
    history: list[BaseMessage] = [HumanMessage("question: where is file 1?")]
    first = chat.invoke([SystemMessage(SYSTEM), HumanMessage("memory: empty"), *history])
    history.append(first)
    history.append(HumanMessage("and file 2?"))
    second = chat.invoke([SystemMessage(SYSTEM), HumanMessage("memory: file 1 found"), *history])
    ids = [m.response_metadata["agentcache"]["conversation_id"] for m in (first, second)]
    assert ids[0] == ids[1]
    segments = second.response_metadata["agentcache"]["segments"]
    by_index = {s["message_index"]: (s["kind"], s["status"]) for s in segments}
    assert by_index[1] == ("fixed", "changed")  # the rewritten memory
    assert by_index[2] == ("fixed", "moved")  # the question after it shifted: reused
    fresh = make(tiny)  # another instance: another conversation
    other = fresh.invoke([SystemMessage(SYSTEM), HumanMessage("memory: empty"), *history[:1]])
    assert other.response_metadata["agentcache"]["conversation_id"] != ids[0]
