"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        type_: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type = (
            status, message, code, param, type_,
        )  # fmt: skip

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def validation_error(exc: RequestValidationError) -> APIError:
    """Name the first offending field; invalid JSON gets its own message."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return APIError(400, f"request body is not valid JSON: {detail}".rstrip(": "),
                        "invalid_json")  # fmt: skip
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if first.get("type") == "literal_error" and loc and loc[-1] == "role":
        msg = f"unknown message role {first.get('input')!r}: {msg}"
    return APIError(400, f"{param}: {msg}" if param else msg, "invalid_value", param)


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(validation_error(exc))


async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc)
