"""Error bodies in each API's shape: OpenAI's {"error": {"message", "type", "param",
"code"}}, and on /v1/messages Anthropic's {"type": "error", "error": {"type", "message"}}
(the message names the field, as `messages.0.content: ...`)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from agentcache.chat.messages import json_problem
from agentcache.chat.runner import TextTooLongError
from agentcache.chat.structured import SchemaError
from agentcache.errors import AgentCacheError, ContextLengthError, OutOfPagesError, PromptError
from agentcache.server.messages_schema import MessagesRequest
from agentcache.server.responses_schema import ResponsesRequest
from agentcache.server.schemas import field_names

FIELDS = field_names() | field_names(ResponsesRequest) | field_names(MessagesRequest)
ENDPOINTS = (
    "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
    "/v1/models", "/health", "/metrics",
)  # fmt: skip
ANTHROPIC_PATHS = ("/v1/messages",)
# Anthropic's error types by status (its API's names); others are api_error
ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    503: "overloaded_error", 504: "timeout_error",
}  # fmt: skip


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        type_: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type = (
            status, message, code, param, type_,
        )  # fmt: skip
        self.headers = headers or {}

    def body(self, path: str = "") -> dict[str, Any]:
        """The error body in the shape of the API that `path` serves."""
        if path.startswith(ANTHROPIC_PATHS):
            kind = ANTHROPIC_TYPES.get(self.status, "api_error")
            return {"type": "error", "error": {"type": kind, "message": self.message}}
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def error_response(err: APIError, path: str = "") -> JSONResponse:
    return JSONResponse(err.body(path), status_code=err.status, headers=err.headers)


def api_error(e: AgentCacheError) -> APIError:
    """The engine's and chat layer's errors as HTTP errors."""
    if isinstance(e, SchemaError):
        return APIError(400, str(e), "unsupported_schema", e.param)
    if isinstance(e, TextTooLongError):
        return APIError(400, str(e), "context_length_exceeded", "messages")
    if isinstance(e, ContextLengthError):
        return APIError(400, str(e), "context_length_exceeded", "max_tokens")
    if isinstance(e, PromptError):
        return APIError(400, str(e), "invalid_value", "messages")
    if isinstance(e, OutOfPagesError):
        return APIError(503, str(e), "server_overloaded", None, "server_error")
    return internal_error(e)


def internal_error(e: Exception) -> APIError:
    """A bug: its type is named, its text (which may quote a client's input) is not."""
    return APIError(500, f"internal error: {type(e).__name__}", "internal_error", None,
                    "server_error")  # fmt: skip


def _param(error: Any) -> list[str]:
    """An error's location as field names and indices; a union's member (e.g. `str` of
    `str | list[str]`), which pydantic puts in the location too, is left out."""
    return [str(p) for p in error.get("loc", ()) if isinstance(p, int) or p in FIELDS]


def validation_error(
    exc: RequestValidationError, content_type: str | None = None, url_path: str = ""
) -> APIError:
    """Name the first offending field; invalid JSON gets its own message."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        detail = json_problem(first.get("ctx", {}).get("error", ""))
        return APIError(400, f"request body is not valid JSON: {detail}".rstrip(": "),
                        "invalid_json")  # fmt: skip
    if tuple(first.get("loc", ())) == ("body",):  # no body, or not an object
        needs = "input" if url_path.endswith("/responses") else "messages"
        msg = f"request body must be a JSON object with 'model' and {needs!r}"
        if content_type and "json" not in content_type:
            msg += f", sent as Content-Type: application/json (got {content_type})"
        return APIError(400, msg, "invalid_value")
    path = _param(first)  # of a union's members, report the one that got furthest into the value
    related = [e for e in errors if _param(e)[: len(path)] == path]
    first = max(related, key=lambda e: len(_param(e)), default=first)
    loc = _param(first)
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if first.get("type") == "literal_error" and loc and loc[-1] == "role":
        msg = f"unknown message role {repr(first.get('input'))[:80]}: {msg}"
    return APIError(400, f"{param}: {msg}" if param else msg, "invalid_value", param)


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    err = validation_error(exc, request.headers.get("content-type"), request.url.path)
    return error_response(err, request.url.path)


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    """Routing errors and bodies FastAPI could not read, in the same OpenAI error body."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 400 and exc.__cause__ is not None:  # e.g. bytes that are not UTF-8
        err = APIError(
            400, f"request body is not valid JSON: {json_problem(exc.__cause__)}", "invalid_json"
        )
    elif exc.status_code == 404:
        served = ", ".join(ENDPOINTS)
        err = APIError(404, f"{exc.detail}: {request.method} {request.url.path[:200]}; this "
                       f"server serves {served}", "not_found")  # fmt: skip
    else:
        err = APIError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}")
    return JSONResponse(err.body(request.url.path), status_code=err.status, headers=exc.headers)


async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc, request.url.path)
