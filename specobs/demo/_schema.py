"""The HTTP API's request bodies and its error answers.

The bodies are pydantic models that accept OpenAI's completions subset and nothing else: unknown
fields, a boolean given as 1 or "yes", a batch of prompts are refused. Every refusal is answered
in OpenAI's error shape ``{"error": {"message": ..., "type": ..., "param": ...}}``, with a
message that says what was wrong, what was expected and what was got.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from ._guard import error_body

__all__ = [
    "CompletionRequest",
    "FaultRequest",
    "InvalidRequest",
    "StreamOptions",
    "add_error_handlers",
    "error_response",
    "validation_message",
]


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)


def _got(value: object) -> str:
    text = json.dumps(value) if isinstance(value, (int, float, str, bool, type(None))) else ""
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{_type_name(value)} {text}".rstrip()


def _boolean(v: Any) -> Any:
    if not isinstance(v, bool):
        raise ValueError(f"expected a boolean, got {_got(v)}")
    return v


#: A JSON boolean and nothing else (pydantic would take "yes" or 1).
_Boolean = Annotated[bool, BeforeValidator(_boolean)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: _Boolean = False


class CompletionRequest(BaseModel):
    """The accepted subset of OpenAI's completions request; unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | list[int]
    model: str | None = None
    max_tokens: int = 16
    stream: _Boolean = False
    temperature: float | None = None
    stream_options: StreamOptions | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, str):
            if not v.strip():
                raise ValueError(
                    "expected a non-empty text or a non-empty array of token ids, got an empty "
                    "text"
                )
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                # JSON allows "\ud800" alone; it is no character and has no UTF-8 form.
                raise ValueError(
                    f"expected text of Unicode characters, got a lone surrogate "
                    f"U+{ord(v[exc.start]):04X} at character {exc.start} (escape a character "
                    "outside the BMP as a surrogate pair, or send UTF-8)"
                ) from None
            return v
        if isinstance(v, list):
            if not v:
                raise ValueError(
                    "expected a non-empty text or a non-empty array of token ids, got an empty "
                    "array"
                )
            if all(isinstance(x, (str, list)) for x in v):
                raise ValueError(
                    "expected one prompt (a text or an array of token ids); batches of prompts "
                    f"are not supported, got an array of {len(v)} prompts"
                )
            for i, tok in enumerate(v):
                if isinstance(tok, bool) or not isinstance(tok, int):
                    raise ValueError(
                        f"expected an array of integer token ids, but element {i} is {_got(tok)}"
                    )
            return v
        raise ValueError(f"expected a text or an array of token ids, got {_got(v)}")

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, str):
            raise ValueError(f"expected a string (the model name), got {_got(v)}")
        return v

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _max_tokens(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected an integer >= 1, got {_got(v)}")
        if v < 1:
            raise ValueError(f"expected an integer >= 1, got {v}")
        return v

    @field_validator("temperature", mode="before")
    @classmethod
    def _temperature(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"expected a number, got {_got(v)}")
        if v != 0:
            raise ValueError(
                f"only greedy decoding is supported: expected 0 (or leave it out), got {v}"
            )
        return float(v)


class FaultRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fault: str | None


class InvalidRequest(Exception):
    """A request the routes refuse: answered with ``status`` and the OpenAI error shape."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def error_response(
    status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
    code: str | None = None, headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, param, kind, code), status_code=status,
                        headers=headers)


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable sentence per pydantic error, joined; the first field as ``param``."""
    parts: list[str] = []
    param: str | None = None
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        # Union members show up as extra path elements ("str", "list[int]"); our validators run
        # before the union, so the field name is the first element.
        field = ".".join(
            x for x in loc if x not in ("str", "int") and not x.startswith(("list[", "function-"))
        )
        kind = err.get("type", "")
        msg = str(err.get("msg", "invalid"))
        if kind == "json_invalid":
            ctx = err.get("ctx") or {}
            return (
                f"the request body is not valid JSON ({ctx.get('error', msg)}); expected a JSON "
                "object such as {\"prompt\": \"...\", \"max_tokens\": 16}",
                None,
            )
        if param is None:
            param = field or None
        if kind == "extra_forbidden":
            parts.append(f"unknown field {field!r}: this server accepts only " + _KNOWN_FIELDS)
        elif kind == "missing" and not field:
            parts.append(
                "the request body is empty: expected a JSON object such as "
                '{"prompt": "...", "max_tokens": 16}'
            )
        elif kind == "missing":
            parts.append(f"{field!r} is required")
        elif kind == "model_attributes_type" or (kind.endswith("_type") and not field):
            got = _got(err.get("input"))
            parts.append(f"expected the request body to be a JSON object, got {got}")
        elif kind == "value_error":
            text = msg.removeprefix("Value error, ")
            parts.append(f"{field!r}: {text}" if field else text)
        else:
            parts.append(f"{field!r}: {msg} (got {_got(err.get('input'))})")
    return "; ".join(dict.fromkeys(parts)) or "invalid request", param


_KNOWN_FIELDS = ", ".join(sorted(CompletionRequest.model_fields))


async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = validation_message(exc)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json" and any(
            isinstance(e.get("input"), (bytes, str)) and not e.get("loc", ())[1:]
            for e in exc.errors()):
        # FastAPI reads a body as JSON only when the request says it is: curl -d sends
        # application/x-www-form-urlencoded, and the body arrived as bytes.
        said = f"Content-Type {kind}" if kind else "no Content-Type"
        message = (f"the request body was not read as JSON ({said}): send it with "
                   "Content-Type: application/json")
        param = None
    return error_response(400, message, param)


async def _on_invalid(request: Request, exc: InvalidRequest) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.param)


async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, message)


def add_error_handlers(app: FastAPI) -> None:
    """Answer bad bodies, refused requests and unknown paths in the OpenAI error shape."""
    app.add_exception_handler(RequestValidationError, _on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(InvalidRequest, _on_invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _on_http)  # type: ignore[arg-type]
