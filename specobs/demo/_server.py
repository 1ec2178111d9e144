"""The demo engine's HTTP server: an OpenAI-style ``/v1/completions`` subset on FastAPI.

Endpoints (all answers JSON unless noted)::

    POST /v1/completions   {"prompt": "text" | [token ids], "max_tokens": 16, "stream": false,
                            "temperature": 0, "model": "...", "stream_options": {...}}
    GET  /v1/models        the one model served
    GET  /health           liveness plus the engine's counters
    GET  /metrics          the specobs series (Prometheus text or OpenMetrics by Accept header)
    GET  /admin/fault      {"fault": null | "wrong-hidden-layers" | "slow-verify" | "stall"
                            | "sync-between-phases"}
    POST /admin/fault      switch the fault at run time (only with an admin token, see below)

Decoding is greedy only (``temperature`` absent or 0). Bad input is answered with a 4xx and the
OpenAI error shape ``{"error": {"message": ..., "type": "invalid_request_error", "param": ...}}``
whose message says what was wrong, what was expected and what was got; the server keeps serving.
Every other failure has the same shape too (an unexpected exception is a JSON 500, logged once).
A client that goes away (streaming or not) cancels its request in the engine.

Limits (:class:`ServerLimits`), so that no client can stall the engine for the others:

* a request body over ``max_body_bytes`` (default 1 MiB) is refused with **413**, from its
  ``Content-Length`` or as soon as a chunked body passes the cap;
* a text prompt longer than ``max_prompt_chars`` is refused before it is tokenized, and
  tokenizing runs on a worker thread, never on the event loop;
* a client gets ``read_timeout_seconds`` (default 10) to send its request headers, and again its
  body: one that sends a byte now and then is dropped (**408** for a slow body, the connection
  closed for slow headers);
* at most ``max_requests`` completions are in flight (running or waiting in the engine, default
  64); beyond that the answer is **429** with ``Retry-After``.

``/admin/*`` exists only when :func:`create_app` gets an ``admin_token`` (``specobs demo
--admin-token`` or ``SPECOBS_DEMO_ADMIN_TOKEN``), and then every call must carry
``Authorization: Bearer <token>`` (401 otherwise). Without a token the paths answer 404.

The engine reports no request gauges itself, so the app samples ``engine.stats()`` a few times a
second and hands running/waiting counts to ``observer.set_requests`` (the stall alert reads them).
:class:`ServerThread` runs the app under uvicorn on a background thread (used by ``specobs demo``
and the tests), with the header read timeout in its HTTP protocol. The limits, the guard that
enforces them and the server thread live in :mod:`specobs.demo._guard`; they are re-exported
here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, cast

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from ._guard import (
    DEFAULT_LIMITS,
    MIN_ADMIN_TOKEN_CHARS,
    Guard,
    ServerLimits,
    ServerThread,
    admin_token_problem,
    error_body,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from specobs import Observer

    from ._engine import RequestHandle, SpecDecodeEngine
    from ._model import WordTokenizer

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_MODEL_NAME",
    "MIN_ADMIN_TOKEN_CHARS",
    "ServerLimits",
    "ServerThread",
    "admin_token_problem",
    "create_app",
]

_log = logging.getLogger("specobs.demo")

DEFAULT_MODEL_NAME = "specobs-demo"
_REQUEST_GAUGE_INTERVAL_SECONDS = 0.25
_DISCONNECT_POLL_SECONDS = 0.25
#: Characters of text prompt allowed per token of the engine's limit before tokenizing. The demo's
#: tokens are words of at most 9 letters plus a space, so 16 leaves room for extra whitespace.
_PROMPT_CHARS_PER_TOKEN = 16


# -- request bodies ---------------------------------------------------------------------------


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


# -- errors -----------------------------------------------------------------------------------


class _InvalidRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def _error(
    status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
    code: str | None = None, headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, param, kind, code), status_code=status,
                        headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
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


# -- the app ----------------------------------------------------------------------------------


def _metrics_registry(observer: Observer | None) -> CollectorRegistry | None:
    """The registry of the observer's PrometheusSink, else a private one over its aggregation."""
    if observer is None:
        return None
    for sink in observer.sinks:
        registry = getattr(sink, "registry", None)
        if registry is not None and getattr(sink, "collector", None) is not None:
            return cast("CollectorRegistry", registry)
    from prometheus_client import CollectorRegistry

    from specobs.sinks.prometheus import SnapshotCollector

    registry = CollectorRegistry(auto_describe=True)
    registry.register(SnapshotCollector(observer.aggregation))
    return registry


@dataclass
class _Served:
    """What every handler reads, kept on ``app.state.served``."""

    engine: SpecDecodeEngine
    observer: Observer | None
    model_name: str
    max_prompt_chars: int
    registry: CollectorRegistry | None
    tokenizer: WordTokenizer | None
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    ids: Iterator[int] = dataclasses.field(default_factory=lambda: itertools.count(1))


def _served(request: Request) -> _Served:
    return cast(_Served, request.app.state.served)


def _tokenizer(served: _Served) -> WordTokenizer:
    if served.tokenizer is None:
        raise _InvalidRequest(
            "this engine has no tokenizer: expected 'prompt' as a list of token ids, got text",
            "prompt",
        )
    return served.tokenizer


def create_app(
    engine: SpecDecodeEngine,
    observer: Observer | None = None,
    *,
    admin_token: str | None = None,
    model_name: str = DEFAULT_MODEL_NAME,
    limits: ServerLimits = DEFAULT_LIMITS,
) -> FastAPI:
    """The FastAPI app serving ``engine`` (a started :class:`SpecDecodeEngine`).

    ``observer``: the engine's specobs observer; ``/metrics`` serves it and the app reports the
    engine's running/waiting requests to it. ``admin_token``: serve ``/admin/fault`` to callers
    that present it as ``Authorization: Bearer <token>`` (``None``: no admin endpoints; at least
    :data:`MIN_ADMIN_TOKEN_CHARS` characters of UTF-8 text, see :func:`admin_token_problem`).
    ``limits``: see :class:`ServerLimits`.

    The routes come from three routers, one per concern: the OpenAI-style completions
    (:data:`_completions`), the server's own endpoints (:data:`_server_info`: models, health,
    metrics) and, with a token, :data:`_admin`. Their handlers read :class:`_Served` from
    ``app.state``.
    """
    problem = None if admin_token is None else admin_token_problem(admin_token)
    if problem is not None:
        raise ValueError(f"the admin token {problem}")
    app = FastAPI(
        title="specobs demo",
        description="OpenAI-style completions over a real speculative decoding engine",
        lifespan=_lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.engine = engine
    app.state.observer = observer
    app.state.served = _Served(
        engine=engine,
        observer=observer,
        model_name=model_name,
        max_prompt_chars=limits.max_prompt_chars or (
            _PROMPT_CHARS_PER_TOKEN * int(engine.max_request_tokens())
        ),
        registry=_metrics_registry(observer),
        tokenizer=engine.tokenizer,
    )
    app.add_middleware(Guard, limits=limits, admin_token=admin_token)
    app.add_exception_handler(RequestValidationError, _on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(_InvalidRequest, _on_invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _on_http)  # type: ignore[arg-type]
    app.include_router(_completions)
    app.include_router(_server_info)
    if admin_token is not None:
        app.include_router(_admin)
    return app


async def _report_requests(engine: SpecDecodeEngine, observer: Observer) -> None:
    # The stall alert needs "requests waiting" even when no cycle runs, so sample the engine's
    # queue here rather than in its (possibly stalled) step loop.
    while True:
        with contextlib.suppress(Exception):
            s = engine.stats()
            observer.set_requests(running=s.active, waiting=s.waiting)
        await asyncio.sleep(_REQUEST_GAUGE_INTERVAL_SECONDS)


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    served: _Served = app.state.served
    task = None
    if served.observer is not None:
        task = asyncio.create_task(_report_requests(served.engine, served.observer))
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# -- errors ---------------------------------------------------------------------------------


async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = _validation_message(exc)
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
    return _error(400, message, param)


async def _on_invalid(request: Request, exc: _InvalidRequest) -> JSONResponse:
    return _error(exc.status, exc.message, exc.param)


async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return _error(exc.status_code, message)


# -- completions ----------------------------------------------------------------------------

_completions = APIRouter()


async def _prompt_ids(served: _Served, body: CompletionRequest) -> list[int]:
    engine = served.engine
    if isinstance(body.prompt, str):
        if len(body.prompt) > served.max_prompt_chars:
            # Refused before tokenizing: the tokenizer's time grows with the text.
            raise _InvalidRequest(
                f"'prompt': expected at most {served.max_prompt_chars} characters of text (this "
                f"model's limit is {engine.max_request_tokens()} tokens), got "
                f"{len(body.prompt)} characters",
                "prompt",
            )
        # Off the event loop: other requests, /health and /metrics go on meanwhile.
        prompt = await asyncio.to_thread(_tokenizer(served).encode, body.prompt)
        if not prompt:
            raise _InvalidRequest(
                "'prompt': expected text with at least one token, got text that encodes to "
                "no tokens",
                "prompt",
            )
        return list(prompt)
    vocab_size = int(engine.config.vocab_size)
    for i, tok in enumerate(body.prompt):
        if not 0 <= tok < vocab_size:
            raise _InvalidRequest(
                f"'prompt': token id {tok} at index {i} is out of range: expected token ids "
                f"in [0, {vocab_size})",
                "prompt",
            )
    return list(body.prompt)


def _submit(engine: SpecDecodeEngine, body: CompletionRequest, prompt: list[int]) -> RequestHandle:
    limit = int(engine.max_request_tokens())
    if body.max_tokens > limit:
        raise _InvalidRequest(
            f"'max_tokens': expected at most {limit} (this model's context is "
            f"{engine.config.max_seq_len} tokens, less room for speculation), got "
            f"{body.max_tokens}",
            "max_tokens",
        )
    if len(prompt) + body.max_tokens > limit:
        raise _InvalidRequest(
            f"the prompt ({len(prompt)} tokens) plus max_tokens ({body.max_tokens}) is "
            f"longer than this model's limit of {limit} tokens: shorten the prompt or ask for "
            f"max_tokens <= {max(limit - len(prompt), 0)}",
            "prompt" if len(prompt) >= limit else "max_tokens",
        )
    try:
        return engine.submit(prompt, body.max_tokens)
    except ValueError as exc:
        raise _InvalidRequest(str(exc), "prompt") from exc
    except RuntimeError as exc:  # engine closed
        raise _InvalidRequest(str(exc), None, status=503) from exc


def _choice(text: str, tokens: list[int], finish_reason: str | None) -> dict[str, Any]:
    return {
        "index": 0,
        "text": text,
        "token_ids": tokens,
        "logprobs": None,
        "finish_reason": finish_reason,
    }


def _usage(prompt: list[int], n: int) -> dict[str, int]:
    return {
        "prompt_tokens": len(prompt),
        "completion_tokens": n,
        "total_tokens": len(prompt) + n,
    }


async def _await_handle(engine: SpecDecodeEngine, handle: RequestHandle,
                        request: Request) -> bool:
    """Wait for the request to finish; False (and the request cancelled) if the client left."""
    fut = asyncio.wrap_future(handle.future)
    while True:
        done, _ = await asyncio.wait({fut}, timeout=_DISCONNECT_POLL_SECONDS)
        if done:
            return True
        if await request.is_disconnected():
            handle.cancel()
            engine.wake()
            return False


@_completions.post("/v1/completions", response_model=None)
async def _complete(body: CompletionRequest, request: Request) -> Response:
    served = _served(request)
    engine = served.engine
    prompt = await _prompt_ids(served, body)
    handle = _submit(engine, body, prompt)
    cid = f"cmpl-{next(served.ids)}"
    now = int(time.time())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream(served, handle, prompt, _Chunk(cid, now, served.model_name, include_usage),
                    request),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    if not await _await_handle(engine, handle, request):
        return Response(status_code=499)
    if handle.finish_reason == "cancelled":  # the engine closed: the server is shutting down
        return _error(503, "the server is shutting down: this request was cancelled before it "
                      "finished", kind="server_error")
    try:
        tokens = handle.wait(0)
    except Exception as exc:
        _log.warning("request %s failed in the engine: %r", cid, exc)
        return _error(500, f"the engine failed this request: {exc!r}", kind="server_error")
    return JSONResponse(
        {
            "id": cid,
            "object": "text_completion",
            "created": now,
            "model": served.model_name,
            "choices": [
                _choice(_tokenizer(served).decode(tokens), tokens, handle.finish_reason)
            ],
            "usage": _usage(prompt, len(tokens)),
        }
    )


@dataclass(frozen=True)
class _Chunk:
    """One streamed completion's server-sent events."""

    cid: str
    created: int
    model_name: str
    include_usage: bool

    def __call__(self, choice: dict[str, Any], usage: dict[str, int] | None = None) -> str:
        payload: dict[str, Any] = {
            "id": self.cid,
            "object": "text_completion",
            "created": self.created,
            "model": self.model_name,
            "choices": [choice] if choice else [],
        }
        if self.include_usage:
            payload["usage"] = usage
        return f"data: {json.dumps(payload)}\n\n"


async def _stream(
    served: _Served,
    handle: RequestHandle,
    prompt: list[int],
    chunk: _Chunk,
    request: Request,
) -> AsyncIterator[str]:
    engine, tokenizer = served.engine, _tokenizer(served)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[list[int], bool]] = asyncio.Queue()

    def on_tokens(new: list[int], done: bool) -> None:  # engine thread
        loop.call_soon_threadsafe(queue.put_nowait, (list(new), done))

    handle.add_callback(on_tokens)
    tokens: list[int] = []
    sent = ""
    finished = False
    checked = time.monotonic()
    try:
        while not finished:
            # uvicorn drops writes to a closed connection silently (ASGI 2.4), so ask about the
            # client now and then, also while tokens flow or nothing comes (a stall).
            if time.monotonic() - checked >= _DISCONNECT_POLL_SECONDS:
                checked = time.monotonic()
                if await request.is_disconnected():
                    return
            try:
                new, finished = await asyncio.wait_for(
                    queue.get(), timeout=_DISCONNECT_POLL_SECONDS
                )
            except asyncio.TimeoutError:
                continue
            while not queue.empty():
                more, done = queue.get_nowait()
                new += more
                finished = finished or done
            if not new and not finished:
                continue
            tokens += new
            text = tokenizer.decode(tokens)
            # Text of a partial UTF-8 sequence may change once the rest arrives; hold it back.
            stable = text if finished else text.rstrip("\ufffd")
            delta = stable[len(sent) :] if stable.startswith(sent) else ""
            sent = sent + delta if delta else sent
            reason = None
            if finished:
                if handle.finish_reason == "error":
                    err = {"message": "the engine failed this request", "type": "server_error"}
                    yield f"data: {json.dumps({'error': err})}\n\n"
                    return
                reason = handle.finish_reason
            yield chunk(_choice(delta, new, reason))
        if chunk.include_usage:
            yield chunk({}, _usage(prompt, len(tokens)))
        yield "data: [DONE]\n\n"
    finally:
        if not handle.done:
            # The client went away (or the server is shutting down): free the engine slot.
            handle.cancel()
            engine.wake()


# -- models, health, metrics ----------------------------------------------------------------

_server_info = APIRouter()


@_server_info.get("/v1/models")
async def _models(request: Request) -> dict[str, Any]:
    served = _served(request)
    return {
        "object": "list",
        "data": [
            {
                "id": served.model_name,
                "object": "model",
                "created": served.created,
                "owned_by": "specobs",
                "max_model_len": int(served.engine.max_request_tokens()),
            }
        ],
    }


@_server_info.get("/health")
async def _health(request: Request) -> dict[str, Any]:
    served = _served(request)
    return {"status": "ok", "model": served.model_name, "engine": served.engine.stats().as_dict()}


@_server_info.get("/metrics", response_model=None)
async def _metrics(request: Request) -> Response:
    registry = _served(request).registry
    if registry is None:
        return _error(404, "no specobs observer is attached to this engine", kind="not_found")
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    # Rendering reads a snapshot under the aggregation lock: keep it off the event loop.
    body = await asyncio.to_thread(encoder, registry)
    return Response(body, media_type=None, headers={"Content-Type": content_type})


# -- admin (only with a token; the guard checks it) -------------------------------------------

_admin = APIRouter()


@_admin.get("/admin/fault")
async def _get_fault(request: Request) -> dict[str, Any]:
    from ._engine import FAULTS

    return {"fault": _served(request).engine.fault, "faults": list(FAULTS)}


@_admin.post("/admin/fault")
async def _set_fault(body: FaultRequest, request: Request) -> dict[str, Any]:
    from ._engine import FAULTS

    engine = _served(request).engine
    if body.fault not in FAULTS and body.fault != "none":  # "none", as the CLI says: no fault
        raise _InvalidRequest(
            f"'fault': expected one of {json.dumps(list(FAULTS))}, got "
            f"{json.dumps(body.fault)}",
            "fault",
        )
    previous = engine.fault
    engine.fault = body.fault
    _log.info("fault switched from %s to %s", previous, body.fault)
    return {"fault": engine.fault, "previous": previous, "faults": list(FAULTS)}
