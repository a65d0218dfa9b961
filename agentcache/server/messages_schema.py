"""Request body of the Anthropic Messages API (`POST /v1/messages`), validated at the edge.

Top-level fields are typed here; `system` blocks, `messages` and their content blocks, `tools`
and `tool_choice` are checked one by one in messages_api.py, so each malformed one is named by
its path (`messages.2.content.0.tool_use_id`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

StopSequence = str


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int = Field(ge=1, strict=True)  # required by the API
    messages: list[Any] = Field(min_length=1)
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[StopSequence] | None = None
    stream: bool = Field(default=False, strict=True)
    temperature: float = Field(default=1.0, ge=0.0, le=1.0, strict=True)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, strict=True)
    top_k: int | None = Field(default=None, strict=True)  # a 400 when set: no top-k sampling
    thinking: dict[str, Any] | None = None  # a 400 unless disabled: the model does not reason
    # automatic caching: one breakpoint at the last cacheable block (cache_control.py)
    cache_control: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None  # format: structured outputs (formats.py)
    metadata: dict[str, Any] | None = None  # accepted; no effect on the reply
    service_tier: str | None = None  # accepted; one tier here
    # as on chat completions: separates this request's KV from every other salt's
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256, strict=True)

    @field_validator("temperature", "top_p", "stream", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return cls.model_fields[info.field_name].default if value is None else value


class CountTokensRequest(MessagesRequest):
    """`POST /v1/messages/count_tokens`: the body of a message request without `max_tokens`
    (nothing is generated); everything else is validated as on /v1/messages."""

    max_tokens: int = Field(default=1, ge=1, strict=True)
