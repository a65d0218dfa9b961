"""The ChatML tools template (agentcache/chat/chatml_tools.jinja) renders a message list and its
tools as agentcache's server does, so another engine given it (`vllm serve --chat-template`)
sends the model the same text: checked through transformers' own chat-template renderer (the
one vLLM calls) on every turn of the chat workloads, and on the shapes those lack."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from agentcache.chat.messages import ChatMessage, ToolSpec
from agentcache.chat.segmenter import ConversationTracker
from agentcache.chat.tools import chat_template
from agentcache.model.tokenizer import CHATML
from agentcache.prompt.segments import Segment, SegmentKind
from agentcache.prompt.tokenize import GENERATION_PROMPT_ID, render_segment

WORKLOADS = Path(__file__).resolve().parents[2] / "benchmarks" / "workloads"
FAMILIES = ("chat", "chat-edit", "chat-fork", "chat-sysprompt", "chat-retry", "chat-compact")
TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}  # fmt: skip


def agentcache_text(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """The text the server's segmenter and tokenizer give the model for this request."""
    msgs = [ChatMessage.from_openai(m) for m in messages]
    specs = [ToolSpec.from_openai(t) for t in tools]
    segs = list(ConversationTracker().segment(msgs, specs).prompt.segments)
    if segs[-1].role != "assistant":  # the generation prompt tokenize_prompt appends
        segs.append(Segment(SegmentKind.UPDATE, "", GENERATION_PROMPT_ID, "assistant"))
    return "".join(render_segment(s, CHATML, i == len(segs) - 1) for i, s in enumerate(segs))


def template_text(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """The text of the template, given the request as vLLM gives it to transformers: tool
    call arguments parsed into objects, tools as their request models dump them."""
    msgs = copy.deepcopy(messages)
    for m in msgs:
        for call in m.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    rendered, _ = render_jinja_template(
        conversations=[msgs],
        tools=tools or None,
        chat_template=chat_template().read_text(),
        add_generation_prompt=True,
    )
    return rendered[0]


def workload_turns() -> list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]]:
    out = []
    for family in FAMILIES:
        for line in (WORKLOADS / f"{family}.jsonl").read_text().splitlines():
            session = json.loads(line)
            for i, turn in enumerate(session["turns"]):
                out.append((f"{session['name']}/{i}", turn["messages"], turn.get("tools") or []))
    return out


def test_every_turn_of_the_chat_workloads_renders_as_the_server_renders_it() -> None:
    turns = workload_turns()
    assert len(turns) > 300 and any(tools for _, _, tools in turns)
    assert any(m.get("tool_calls") for _, msgs, _ in turns for m in msgs)
    for name, messages, tools in turns:
        assert template_text(messages, tools) == agentcache_text(messages, tools), name


@pytest.mark.parametrize(
    ("messages", "tools"),
    [
        ([{"role": "user", "content": "hi"}], []),  # no system message: none is added
        ([{"role": "user", "content": "hi"}], [TOOL]),  # tools without a system message
        ([{"role": "system", "content": "a"}, {"role": "developer", "content": "b"},
          {"role": "user", "content": "c"}, {"role": "system", "content": "late"}], [TOOL]),
        ([{"role": "system", "content": "only"}], [TOOL]),  # every message a system one
        ([{"role": "user", "content": "x"},
          {"role": "assistant", "content": "Reading.", "tool_calls": [
              {"id": "c1", "type": "function",
               "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}},
              {"id": "c2", "type": "function",
               "function": {"name": "read_file", "arguments": "{}"}}]},
          {"role": "tool", "tool_call_id": "c1", "content": "print(1)"},
          {"role": "tool", "tool_call_id": "c2", "content": ""},
          {"role": "assistant", "content": "Done."}], [TOOL]),  # last message an assistant's
        ([{"role": "user", "content": "x"}],
         [{"type": "function", "function": {"name": "ping"}}]),  # no description, no parameters
        ([{"role": "user", "content": "x"}],  # both null, as vLLM's request models dump them
         [{"type": "function", "function": {"name": "ping", "description": None,
                                            "parameters": None}}]),
    ],
)  # fmt: skip
def test_shapes_the_workloads_lack(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> None:
    assert template_text(messages, tools) == agentcache_text(messages, tools)


@pytest.mark.slow
def test_the_default_models_tokenizer_gives_the_servers_ids_for_every_workload_turn() -> None:
    """The template's text, tokenized whole as an engine tokenizes a rendered chat, gives the
    token ids the server's segment-by-segment tokenization gives (no id differs at a message
    boundary), with the default model's tokenizer."""
    from agentcache.model.loading import convert_default_model, default_cache_dir, load_tokenizer
    from agentcache.model.tokenizer import HFTokenizer
    from agentcache.prompt.tokenize import tokenize_prompt

    hf = load_tokenizer(convert_default_model(default_cache_dir()))
    tok = HFTokenizer(hf, "default")
    for name, messages, tools in workload_turns():
        msgs = [ChatMessage.from_openai(m) for m in messages]
        specs = [ToolSpec.from_openai(t) for t in tools]
        prompt = ConversationTracker().segment(msgs, specs).prompt
        ours = list(tokenize_prompt(prompt, tok, CHATML).ids)
        theirs = hf.encode(template_text(messages, tools), add_special_tokens=False)
        assert theirs == ours, name


def test_the_template_ships_with_the_package() -> None:
    path = chat_template()
    assert path.is_file() and path.suffix == ".jinja"
    assert "<tool_call>" in path.read_text()
