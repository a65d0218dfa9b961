"""Request bodies of the OpenAI chat API, validated at the edge (unknown fields are ignored).

Numbers and booleans are strict, as in OpenAI's API: `"stream": "yes"` or `"max_tokens": "5"`
is an error, not a guess. Fields OpenAI declares nullable take null as their default.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

MAX_CACHE_KEY_CHARS = 256  # prompt_cache_key


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
    strict: bool | None = Field(default=None, strict=True)  # a forced call's arguments enforced


class ToolIn(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionIn


class NamedFunction(BaseModel):
    name: str


class ToolChoiceIn(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class AllowedTools(BaseModel):
    mode: Literal["auto", "required"]
    tools: list[ToolChoiceIn] = Field(min_length=1)


class AllowedToolsChoice(BaseModel):
    """Only these tools may be called (the others are not shown to the model)."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


class StreamOptions(BaseModel):
    include_usage: bool = Field(default=False, strict=True)


StopString = Annotated[str, Field(min_length=1)]


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[MessageIn] = Field(min_length=1)
    tools: list[ToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceIn | AllowedToolsChoice | None = (
        None
    )
    stop: StopString | list[StopString] | None = None
    max_tokens: int | None = Field(default=None, ge=0, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=0, strict=True)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, strict=True)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, strict=True)
    seed: int | None = Field(default=None, ge=-(1 << 63), le=(1 << 64) - 1, strict=True)
    n: int = Field(default=1, ge=1, le=1, strict=True)
    stream: bool = Field(default=False, strict=True)
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None  # formats.py
    parallel_tool_calls: bool | None = Field(default=None, strict=True)  # false: one call at most
    logprobs: bool | None = Field(default=None, strict=True)
    top_logprobs: int | None = Field(default=None, ge=0, le=20, strict=True)
    # retention requests, checked and reported (cache_control.py)
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    metadata: dict[str, str] | None = None  # accepted; no effect on the reply
    store: bool | None = Field(default=None, strict=True)  # accepted; nothing is stored
    service_tier: str | None = Field(default=None, strict=True)  # accepted; one tier
    reasoning_effort: Any = None  # a 400 when set: the served models do not reason
    user: str | None = None  # accepted and ignored: never a conversation's or a tenant's name
    # separates this request's KV from every request with another salt, even identical
    # prefixes (as vLLM's cache_salt)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256, strict=True)
    # OpenAI's hint that requests share a prefix: groups a tenant's requests in reports (a
    # request without a conversation token is compared with its group's last one), never
    # separates or joins what is reused
    prompt_cache_key: str | None = Field(
        default=None, min_length=1, max_length=MAX_CACHE_KEY_CHARS, strict=True
    )

    @field_validator("temperature", "top_p", "n", "stream", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return cls.model_fields[info.field_name].default if value is None else value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


def field_names(model: type[BaseModel] = ChatCompletionRequest) -> frozenset[str]:
    """Every field name in `model` and the models it nests: what an error's `param` may name
    (pydantic also puts the member of a union it tried in an error's location)."""
    names: set[str] = set()
    todo = [f.annotation for f in model.model_fields.values()]
    names.update(model.model_fields)
    while todo:
        t = todo.pop()
        if isinstance(t, type) and issubclass(t, BaseModel):
            names |= field_names(t)
        todo.extend(typing.get_args(t))
    return frozenset(names)
