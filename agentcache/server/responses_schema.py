"""Request body of the OpenAI Responses API (`POST /v1/responses`), validated at the edge.

Top-level fields are typed here; `input` items and `tools` are checked one by one in
responses.py, so each malformed one is named by its path (`input.2.call_id`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from agentcache.server.schemas import MAX_CACHE_KEY_CHARS


class NamedTool(BaseModel):
    type: Literal["function"]
    name: str = Field(min_length=1)


class AllowedTools(BaseModel):
    """Only these tools may be called (the others are not shown to the model)."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[NamedTool] = Field(min_length=1)


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: dict[str, Any] | None = None  # formats.py


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | AllowedTools | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, strict=True)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, strict=True)
    stream: bool = Field(default=False, strict=True)
    store: bool = Field(default=True, strict=True)
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=128)
    text: TextConfig | None = None
    parallel_tool_calls: bool | None = Field(default=None, strict=True)
    reasoning: Any = None  # a 400 when set: the served models do not reason
    metadata: dict[str, str] | None = None  # echoed, no effect on the reply
    user: str | None = None  # accepted and ignored, as on chat completions
    # retention requests, checked and reported (cache_control.py)
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    service_tier: str | None = Field(default=None, strict=True)  # accepted; one tier
    # "message.output_text.logprobs": each output_text token's logprob (responses.py)
    include: list[str] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20, strict=True)
    # as on chat completions: OpenAI's grouping hint (reports only), and the tenant's salt
    prompt_cache_key: str | None = Field(
        default=None, min_length=1, max_length=MAX_CACHE_KEY_CHARS, strict=True
    )
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256, strict=True)

    @field_validator("temperature", "top_p", "stream", "store", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return cls.model_fields[info.field_name].default if value is None else value
