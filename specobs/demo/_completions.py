"""``POST /v1/completions``: a prompt in, the engine's greedy completion out, whole or streamed.

A text prompt is tokenized on a worker thread; a token-id prompt is checked against the
vocabulary. The request waits on the engine's future (or, streamed, on its token callbacks) and
asks now and then whether the client is still there: one that went away cancels its request, so
the engine frees the slot. :class:`Served` is what every route of the app reads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ._schema import CompletionRequest, InvalidRequest, error_response

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from specobs import Observer

    from ._engine import SpecDecodeEngine
    from ._model import WordTokenizer
    from ._request import RequestHandle

__all__ = ["Served", "completions_router", "served_of", "tokenizer_of"]

_log = logging.getLogger("specobs.demo")

_DISCONNECT_POLL_SECONDS = 0.25


@dataclass
class Served:
    """What every handler reads, kept on ``app.state.served``."""

    engine: SpecDecodeEngine
    observer: Observer | None
    model_name: str
    max_prompt_chars: int
    registry: CollectorRegistry | None
    tokenizer: WordTokenizer | None
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    ids: Iterator[int] = dataclasses.field(default_factory=lambda: itertools.count(1))


def served_of(request: Request) -> Served:
    """The app's :class:`Served`, as ``create_app`` left it."""
    return cast(Served, request.app.state.served)


def tokenizer_of(served: Served) -> WordTokenizer:
    """The engine's tokenizer; a text prompt to an engine without one is refused."""
    if served.tokenizer is None:
        raise InvalidRequest(
            "this engine has no tokenizer: expected 'prompt' as a list of token ids, got text",
            "prompt",
        )
    return served.tokenizer


completions_router = APIRouter()


async def _prompt_ids(served: Served, body: CompletionRequest) -> list[int]:
    engine = served.engine
    if isinstance(body.prompt, str):
        if len(body.prompt) > served.max_prompt_chars:
            # Refused before tokenizing: the tokenizer's time grows with the text.
            raise InvalidRequest(
                f"'prompt': expected at most {served.max_prompt_chars} characters of text (this "
                f"model's limit is {engine.max_request_tokens()} tokens), got "
                f"{len(body.prompt)} characters",
                "prompt",
            )
        # Off the event loop: other requests, /health and /metrics go on meanwhile.
        prompt = await asyncio.to_thread(tokenizer_of(served).encode, body.prompt)
        if not prompt:
            raise InvalidRequest(
                "'prompt': expected text with at least one token, got text that encodes to "
                "no tokens",
                "prompt",
            )
        return list(prompt)
    vocab_size = int(engine.config.vocab_size)
    for i, tok in enumerate(body.prompt):
        if not 0 <= tok < vocab_size:
            raise InvalidRequest(
                f"'prompt': token id {tok} at index {i} is out of range: expected token ids "
                f"in [0, {vocab_size})",
                "prompt",
            )
    return list(body.prompt)


def _submit(engine: SpecDecodeEngine, body: CompletionRequest, prompt: list[int]) -> RequestHandle:
    limit = int(engine.max_request_tokens())
    if body.max_tokens > limit:
        raise InvalidRequest(
            f"'max_tokens': expected at most {limit} (this model's context is "
            f"{engine.config.max_seq_len} tokens, less room for speculation), got "
            f"{body.max_tokens}",
            "max_tokens",
        )
    if len(prompt) + body.max_tokens > limit:
        raise InvalidRequest(
            f"the prompt ({len(prompt)} tokens) plus max_tokens ({body.max_tokens}) is "
            f"longer than this model's limit of {limit} tokens: shorten the prompt or ask for "
            f"max_tokens <= {max(limit - len(prompt), 0)}",
            "prompt" if len(prompt) >= limit else "max_tokens",
        )
    try:
        return engine.submit(prompt, body.max_tokens)
    except ValueError as exc:
        raise InvalidRequest(str(exc), "prompt") from exc
    except RuntimeError as exc:  # engine closed
        raise InvalidRequest(str(exc), None, status=503) from exc


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


@completions_router.post("/v1/completions", response_model=None)
async def _complete(body: CompletionRequest, request: Request) -> Response:
    served = served_of(request)
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
        return error_response(503, "the server is shutting down: this request was cancelled "
                              "before it finished", kind="server_error")
    try:
        tokens = handle.wait(0)
    except Exception as exc:
        _log.warning("request %s failed in the engine: %r", cid, exc)
        return error_response(500, f"the engine failed this request: {exc!r}", kind="server_error")
    return JSONResponse(
        {
            "id": cid,
            "object": "text_completion",
            "created": now,
            "model": served.model_name,
            "choices": [
                _choice(tokenizer_of(served).decode(tokens), tokens, handle.finish_reason)
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
    served: Served,
    handle: RequestHandle,
    prompt: list[int],
    chunk: _Chunk,
    request: Request,
) -> AsyncIterator[str]:
    engine, tokenizer = served.engine, tokenizer_of(served)
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
