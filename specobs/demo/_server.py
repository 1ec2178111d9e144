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
here. The request bodies and error answers are :mod:`._schema`'s, the completions route
:mod:`._completions`'s; this module builds the app and serves models, health, metrics and
admin.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from ._completions import Served, completions_router, served_of
from ._guard import (
    DEFAULT_LIMITS,
    MIN_ADMIN_TOKEN_CHARS,
    Guard,
    ServerLimits,
    ServerThread,
    admin_token_problem,
)
from ._schema import FaultRequest, InvalidRequest, add_error_handlers, error_response

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from specobs import Observer

    from ._engine import SpecDecodeEngine

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
#: Characters of text prompt allowed per token of the engine's limit before tokenizing. The demo's
#: tokens are words of at most 9 letters plus a space, so 16 leaves room for extra whitespace.
_PROMPT_CHARS_PER_TOKEN = 16


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
    (:data:`completions_router`), the server's own endpoints (:data:`_server_info`: models, health,
    metrics) and, with a token, :data:`_admin`. Their handlers read :class:`Served` from
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
    app.state.served = Served(
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
    add_error_handlers(app)
    app.include_router(completions_router)
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
    served: Served = app.state.served
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


# -- models, health, metrics ----------------------------------------------------------------

_server_info = APIRouter()


@_server_info.get("/v1/models")
async def _models(request: Request) -> dict[str, Any]:
    served = served_of(request)
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
    served = served_of(request)
    return {"status": "ok", "model": served.model_name, "engine": served.engine.stats().as_dict()}


@_server_info.get("/metrics", response_model=None)
async def _metrics(request: Request) -> Response:
    registry = served_of(request).registry
    if registry is None:
        return error_response(404, "no specobs observer is attached to this engine",
                              kind="not_found")
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

    return {"fault": served_of(request).engine.fault, "faults": list(FAULTS)}


@_admin.post("/admin/fault")
async def _set_fault(body: FaultRequest, request: Request) -> dict[str, Any]:
    from ._engine import FAULTS

    engine = served_of(request).engine
    if body.fault not in FAULTS and body.fault != "none":  # "none", as the CLI says: no fault
        raise InvalidRequest(
            f"'fault': expected one of {json.dumps(list(FAULTS))}, got "
            f"{json.dumps(body.fault)}",
            "fault",
        )
    previous = engine.fault
    engine.fault = body.fault
    _log.info("fault switched from %s to %s", previous, body.fault)
    return {"fault": engine.fault, "previous": previous, "faults": list(FAULTS)}
