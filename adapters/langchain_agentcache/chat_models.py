"""`ChatAgentCache`: a LangChain chat model whose KV is reused across an agent's turns.

The message list is segmented by agentcache's chat layer (system message -> system segment;
every other message -> a fixed segment looked up by its content), so an unchanged LangChain
agent gets segment-level KV reuse. Tools are described to the model and its
tool calls parsed in the Hermes format (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`,
see `agentcache.chat.tools`). Every reply carries `usage_metadata` (with
`input_token_details.cache_read` = reused prompt tokens) and `response_metadata["agentcache"]`,
the per-segment why-no-hit report.

Hooks:
- `_generate`: one completion on the engine;
- `_stream`: the same, yielding content as tokens are produced, tool calls in the last chunk;
- `bind_tools`: OpenAI-format tools; a `tool_choice` naming a tool (or "any" with one tool)
  starts the reply with that call's opening, so the model fills in the arguments;
- `with_structured_output`: LangChain's default (one tool, forced).
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Self

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.language_models.base import LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, field_validator, model_validator

from agentcache.chat.messages import ToolSpec
from agentcache.chat.runner import ChatEngine, ChatRequest
from agentcache.chat.runner import ChatResult as AgentChatResult
from agentcache.chat.tools import forced_call_prefix
from agentcache.reuse import STRATEGIES
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from langchain_agentcache.messages import (
    ai_message,
    response_metadata,
    to_chat_messages,
    usage_metadata,
)

DEFAULT_MAX_TOKENS = 256


class ChatAgentCache(BaseChatModel):
    """Chat model on an agentcache `Engine` (built lazily from `model_path` when not given).

    `assistant_prefill(messages) -> str | None`, when set, returns text the reply starts with;
    the model continues it (a fixed reply start, e.g. to force a format).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    model_name: str = Field(default="smollm2-135m-instruct", alias="model")
    model_path: str | None = None  # local HF folder; None: the embedded default model
    engine: Engine | None = Field(default=None, exclude=True)
    strategy: str | None = None  # reuse strategy; None: the engine's default
    temperature: float = 0.0
    max_tokens: int | None = None
    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    seed: int | None = None
    # the conversation token of an earlier reply (`response_metadata["agentcache"]
    # ["conversation_id"]`) to continue its conversation; each reply's token is echoed next call
    conversation_id: str | None = None
    assistant_prefill: Callable[[Sequence[BaseMessage]], str | None] | None = Field(
        default=None, exclude=True
    )
    # accepted for compatibility with LangChain's standard parameters; a local model has no
    # network calls to time out or retry and no key
    timeout: float | None = None
    max_retries: int | None = None
    api_key: SecretStr | None = None
    streaming: bool = False

    _chat: ChatEngine | None = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _conversation: str | None = PrivateAttr(default=None)  # the last reply's token

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, name: str | None) -> str | None:
        if name is not None:
            STRATEGIES.get(name)  # here, not at the first call: unknown names list the known
        return name

    @model_validator(mode="after")
    def _valid_generation_params(self) -> Self:
        self._params(self.max_tokens, self.stop or ())  # fails here, not at the first call
        return self

    def _params(
        self, max_tokens: int | None = None, stops: Sequence[str] | str = (), **kwargs: Any
    ) -> GenerationParams:
        return GenerationParams(
            max_new_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            temperature=kwargs.get("temperature", self.temperature),
            seed=kwargs.get("seed", self.seed),
            stop=(stops,) if isinstance(stops, str) else tuple(stops),  # a string is one stop
        )

    @property
    def _llm_type(self) -> str:
        return "agentcache-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "strategy": self.strategy}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="agentcache",
            ls_model_name=kwargs.get("model", self.model_name),
            ls_model_type="chat",
            ls_temperature=kwargs.get("temperature", self.temperature),
        )
        if (max_tokens := kwargs.get("max_tokens", self.max_tokens)) is not None:
            params["ls_max_tokens"] = max_tokens
        if ls_stop := stop or kwargs.get("stop") or self.stop:
            params["ls_stop"] = ls_stop
        return params

    @property
    def chat_engine(self) -> ChatEngine:
        with self._lock:
            if self._chat is None:
                engine = self.engine
                if engine is None:
                    from agentcache.model.loading import load_model

                    engine = Engine(load_model(self.model_path), EngineConfig())
                self._chat = ChatEngine(engine)
            return self._chat

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        formatted = [convert_to_openai_tool(t) for t in tools]
        for tool in formatted:
            ToolSpec.from_openai(tool)  # a schema that is not JSON Schema fails here
        return super().bind(tools=formatted, tool_choice=_tool_choice(tool_choice), **kwargs)

    def _request(
        self, messages: Sequence[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> tuple[ChatRequest, bool]:
        tools = tuple(ToolSpec.from_openai(t) for t in kwargs.get("tools") or ())
        choice = kwargs.get("tool_choice")
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        stops = stop or kwargs.get("stop") or self.stop or ()
        params = self._params(max_tokens, stops, **kwargs)
        prefill = _forced_prefill(choice, tools) if tools else None
        if prefill is None and self.assistant_prefill is not None:
            prefill = self.assistant_prefill(messages)
        request = ChatRequest(
            to_chat_messages(messages), params, tools, self._conversation or self.conversation_id,
            prefill, self.strategy,
            tool_calls=choice != "none",  # the tools stay in the prompt, as the server keeps them
        )  # fmt: skip
        return request, max_tokens is None

    def _model_name(self, kwargs: dict[str, Any]) -> str:
        return str(kwargs.get("model", self.model_name))

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        chat = self.chat_engine
        request, clamp = self._request(messages, stop, kwargs)
        result = chat.run(chat.prepare(request, clamp))
        self._conversation = result.report.conversation_id
        message = ai_message(result, self._model_name(kwargs))
        return ChatResult(
            generations=[ChatGeneration(message=message)],
            llm_output={"model_name": self._model_name(kwargs)},
        )

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        chat = self.chat_engine
        request, clamp = self._request(messages, stop, kwargs)
        prepared = chat.prepare(request, clamp)
        pieces: queue.Queue[tuple[str, Any]] = queue.Queue()
        stopped = threading.Event()

        def work() -> None:  # stops at the next token once the consumer stops iterating
            try:
                pieces.put(("done", chat.run(prepared, lambda p: pieces.put(("text", p)), stopped)))
            except BaseException as e:  # re-raised in the consumer's thread
                pieces.put(("error", e))

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        try:
            while True:
                kind, item = pieces.get()
                if kind == "error":
                    raise item
                if kind == "done":
                    self._conversation = item.report.conversation_id
                    yield self._last_chunk(item, kwargs)
                    return
                if item:
                    chunk = ChatGenerationChunk(message=AIMessageChunk(content=item))
                    if run_manager is not None:
                        run_manager.on_llm_new_token(item, chunk=chunk)
                    yield chunk
        finally:
            stopped.set()
            worker.join()

    def _last_chunk(self, result: AgentChatResult, kwargs: dict[str, Any]) -> ChatGenerationChunk:
        calls = [
            {"name": c.name, "args": json.dumps(dict(c.arguments)), "id": c.id, "index": i,
             "type": "tool_call_chunk"}
            for i, c in enumerate(result.tool_calls)
        ]  # fmt: skip
        message = AIMessageChunk(
            content="",
            tool_call_chunks=calls,  # type: ignore[arg-type]
            usage_metadata=usage_metadata(result),  # type: ignore[arg-type]
            response_metadata=response_metadata(result, self._model_name(kwargs)),
            chunk_position="last",
        )
        return ChatGenerationChunk(message=message)


def _tool_choice(choice: str | dict[str, Any] | bool | None) -> str | dict[str, Any] | None:
    """LangChain's spellings -> OpenAI's: "any"/True -> "required", a name -> that function."""
    if choice is None or isinstance(choice, dict):
        return choice
    if choice is True or choice in ("any", "required"):
        return "required"
    if choice is False:
        return None
    if choice in ("auto", "none"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _forced_prefill(choice: Any, tools: Sequence[ToolSpec]) -> str | None:
    if isinstance(choice, dict):
        return forced_call_prefix(choice["function"]["name"])
    if choice == "required":
        return forced_call_prefix(tools[0].name if len(tools) == 1 else None)
    return None
