"""Request bodies of the OpenAI chat API, validated at the edge (unknown fields are ignored)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class FunctionCallIn(BaseModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(BaseModel):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCallIn


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class FunctionIn(BaseModel):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: Any = None  # checked as JSON Schema by the chat layer


class ToolIn(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionIn


class NamedFunction(BaseModel):
    name: str


class ToolChoiceIn(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[MessageIn] = Field(min_length=1)
    tools: list[ToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceIn | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
