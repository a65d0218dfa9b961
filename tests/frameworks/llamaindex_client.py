"""LlamaIndex's `FunctionAgent` on `OpenAILike` against one `agentcache serve`: two runs of one
conversation (the task's question, then its follow-up), whose transcript it prints as JSON.

LlamaIndex needs `openai<3` and the main venv has 3.x, so this runs in a venv of its own
(`make llamaindex`), which has neither agentcache nor pytest: `test_llamaindex.py` runs it as

    .venv-llamaindex/bin/python tests/frameworks/llamaindex_client.py --base-url URL/v1 --model M

Transcript: `{"turns": [{"question", "steps": [{"content", "tool_calls", "usage"}],
"tool_results": [{"tool", "kwargs", "output"}], "answer"}]}`, one step per model call in the
order sent; `usage` is the reply's OpenAI usage (`prompt_tokens_details.cached_tokens`
included), as the agent's `AgentOutput.raw` holds it: the last chunk of the streamed reply,
which carries usage because the model asks for it (`stream_options.include_usage`)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from typing import Any

from llama_index.core.agent.workflow import AgentOutput, FunctionAgent, ToolCallResult
from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.memory import Memory
from llama_index.core.tools import BaseTool
from llama_index.llms.openai_like import OpenAILike
from task import (  # task.py beside this file: a script's folder is first on sys.path
    FOLLOW_UP,
    INSTRUCTIONS,
    MAX_TOKENS,
    QUESTION,
    get_temperature,
    to_fahrenheit,
)

FORCED = {0: "get_temperature", 1: "to_fahrenheit"}  # tool results so far -> the step's tool


class StepForcedLLM(OpenAILike):
    """`OpenAILike` that names each step's tool (the 135M model, left to `"auto"`, calls a tool
    again on every step). The step is the number of tool results since the last user message;
    past `FORCED`, `"none"` asks for the answer, with the tools still in the prompt, so the step
    extends the one before. `FunctionAgent`'s own `initial_tool_choice` forces the first step
    only."""

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: str | dict[str, Any] | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        step = 0
        for m in reversed(chat_history or []):
            if m.role == MessageRole.USER:
                break
            step += m.role == MessageRole.TOOL
        return super()._prepare_chat_with_tools(
            tools, user_msg, chat_history, verbose, allow_parallel_tool_calls, tool_required,
            FORCED.get(step, "none"), strict, **kwargs,
        )  # fmt: skip


def make_agent(base_url: str, model: str) -> FunctionAgent:
    """`strict=True` marks the tools strict, so the server decodes a named call's arguments to
    the tool's schema (the 135M model otherwise writes the schema itself as the arguments)."""
    llm = StepForcedLLM(
        model=model, api_base=base_url, api_key="unused", is_chat_model=True,
        is_function_calling_model=True, strict=True, temperature=0, max_tokens=MAX_TOKENS,
        max_retries=0, timeout=600, additional_kwargs={"stream_options": {"include_usage": True}},
    )  # fmt: skip
    return FunctionAgent(tools=[get_temperature, to_fahrenheit], llm=llm,
                         system_prompt=INSTRUCTIONS)  # fmt: skip


def usage(raw: Any) -> dict[str, Any] | None:
    return raw.get("usage") if isinstance(raw, dict) else None


async def turn(agent: FunctionAgent, memory: Memory, question: str) -> dict[str, Any]:
    """One `agent.run`, recorded from its events: each model call's reply, each tool's result."""
    handler = agent.run(user_msg=question, memory=memory)
    steps: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    async for ev in handler.stream_events():
        if isinstance(ev, AgentOutput):
            calls = [{"tool": c.tool_name, "kwargs": c.tool_kwargs} for c in ev.tool_calls]
            steps.append({"content": ev.response.content, "tool_calls": calls,
                          "usage": usage(ev.raw)})  # fmt: skip
        elif isinstance(ev, ToolCallResult):
            results.append({"tool": ev.tool_name, "kwargs": ev.tool_kwargs,
                            "output": str(ev.tool_output.content)})  # fmt: skip
    answer = await handler
    return {"question": question, "steps": steps, "tool_results": results, "answer": str(answer)}


async def main(base_url: str, model: str) -> dict[str, Any]:
    agent = make_agent(base_url, model)
    # The conversation, passed to each run. (A `Context` passed to each run instead loses it
    # here: the workflow serializes its state between runs, and skips the memory.)
    memory = Memory.from_defaults(session_id="meteo")
    return {"turns": [await turn(agent, memory, q) for q in (QUESTION, FOLLOW_UP)]}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="LlamaIndex's FunctionAgent on the tool task")
    p.add_argument("--base-url", required=True, help="the server's OpenAI-style /v1 URL")
    p.add_argument("--model", required=True, help="the server's --served-model-name")
    args = p.parse_args()
    print(json.dumps(asyncio.run(main(args.base_url, args.model))))
