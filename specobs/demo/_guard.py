"""What stands between the demo's routes and the network: the limits one client may cost
(:class:`ServerLimits`), the admin token's rules, an ASGI guard in front of the app (the token,
the admission limit, the body cap and its read deadline, a JSON 500 for anything that
escapes), uvicorn's HTTP protocol with a deadline on each request's headers, and
:class:`ServerThread`, which serves the app on a daemon thread. Nothing here knows the routes
or the engine; errors have the OpenAI shape the routes answer with too (:func:`error_body`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_LIMITS",
    "MIN_ADMIN_TOKEN_CHARS",
    "Guard",
    "ServerLimits",
    "ServerThread",
    "admin_token_problem",
    "error_body",
]

_log = logging.getLogger("specobs.demo")

#: An admin token shorter than this is refused: it would be guessable.
MIN_ADMIN_TOKEN_CHARS = 16
_MAKE_TOKEN = "make one with: python -c 'import secrets; print(secrets.token_hex(16))'"


def admin_token_problem(token: str) -> str | None:
    """Why ``token`` cannot be the admin token, as the end of a sentence that names where it came
    from (``f"--admin-token {problem}"``); ``None`` when it can.

    It must be long enough not to be guessed, and UTF-8 text: the server compares it with the
    bytes of the ``Authorization`` header. ``os.environ`` and ``sys.argv`` turn bytes that are not
    UTF-8 into lone surrogates (``surrogateescape``), which no encoder accepts.
    """
    if len(token) < MIN_ADMIN_TOKEN_CHARS:
        return (f"must have at least {MIN_ADMIN_TOKEN_CHARS} characters, got {len(token)}; "
                f"{_MAKE_TOKEN}")
    try:
        token.encode("utf-8")
    except UnicodeEncodeError:
        # The token is a secret: neither it nor where it goes wrong is quoted.
        return f"is not UTF-8 text (it holds bytes that do not decode as UTF-8); {_MAKE_TOKEN}"
    return None


@dataclass(frozen=True)
class ServerLimits:
    """What one client may cost the server (see the module docstring)."""

    max_body_bytes: int = 1024 * 1024
    """Largest request body; more is answered 413."""
    max_requests: int = 64
    """Completions in flight (running or waiting in the engine); more are answered 429."""
    read_timeout_seconds: float = 10.0
    """Seconds a client has to send its request headers, and again its body."""
    retry_after_seconds: int = 1
    """The ``Retry-After`` of a 429."""
    max_prompt_chars: int | None = None
    """Longest text prompt tokenized; ``None``: 16 characters per token of the engine's limit."""

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or self.max_requests < 1 or self.retry_after_seconds < 0:
            raise ValueError(f"ServerLimits must be positive, got {self}")
        if not 0 < self.read_timeout_seconds < float("inf"):
            raise ValueError(
                f"read_timeout_seconds must be a positive number, got {self.read_timeout_seconds}"
            )


DEFAULT_LIMITS = ServerLimits()


def error_body(
    message: str, param: str | None = None, kind: str = "invalid_request_error",
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def _send_error(
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]], status: int, message: str, *,
    kind: str = "invalid_request_error", code: str | None = None,
    headers: tuple[tuple[bytes, bytes], ...] = (), close: bool = False,
) -> None:
    """An OpenAI-style JSON error straight over ASGI (for the guard, outside FastAPI)."""
    body = json.dumps(error_body(message, None, kind, code)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
           *headers]
    if close:
        # The request's body was not (fully) read: the connection cannot carry another request.
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# -- the guard ------------------------------------------------------------------------------

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]


class Guard:
    """ASGI middleware in front of the routes: the admin token, the admission limit, the body
    cap and the body's read deadline, and a JSON 500 for anything that escapes.

    Everything here happens before FastAPI reads or parses anything: an unauthorized caller
    learns nothing from a body, and the body is read whole before the route runs, so a 413 or 408
    never meets a half-started handler (the route then gets the body from memory).
    """

    def __init__(self, app: Callable[[_Scope, _Receive, _Send], Awaitable[None]],
                 limits: ServerLimits, admin_token: str | None) -> None:
        self.app = app
        self.limits = limits
        self.admin_token = None if admin_token is None else admin_token.encode()
        # Only the event loop's thread touches it: no lock.
        self.in_flight = 0

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if (path == "/admin" or path.startswith("/admin/")) and not await self._admin(scope, send):
            return
        admitted = path == "/v1/completions" and scope["method"] == "POST"
        if admitted and self.in_flight >= self.limits.max_requests:
            await _send_error(
                send, 429,
                f"this server already has {self.in_flight} completions in flight, its limit: "
                f"retry after {self.limits.retry_after_seconds} s",
                kind="rate_limit_error", code="rate_limit_exceeded",
                headers=((b"retry-after", str(self.limits.retry_after_seconds).encode()),),
            )
            return
        started = False

        async def tracked(message: _Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        if admitted:
            self.in_flight += 1
        try:
            replay = await self._read_body(scope, receive, send)
            if replay is not None:
                await self.app(scope, replay, tracked)
        except Exception:
            _log.exception("%s %s failed", scope["method"], scope["path"])
            if not started:
                await _send_error(send, 500, "the server failed this request (see its log)",
                                  kind="server_error", close=True)
        finally:
            if admitted:
                self.in_flight -= 1

    async def _admin(self, scope: _Scope, send: _Send) -> bool:
        """True when the caller may go on to an admin route; else answered here (404, 401)."""
        if self.admin_token is None:
            await _send_error(
                send, 404,
                "the admin endpoints are off: start specobs demo with --admin-token (or set "
                "SPECOBS_DEMO_ADMIN_TOKEN) to switch faults at run time",
                kind="not_found", close=True,
            )
            return False
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, token = given.partition(b" ")
        # Constant time: the comparison must not tell how much of a guess was right.
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.admin_token):
            return True
        await _send_error(
            send, 401,
            "the admin endpoints need this server's admin token as 'Authorization: Bearer "
            "<token>'" + (": the token given is wrong" if token else ""),
            kind="authentication_error", code="invalid_admin_token", close=True,
            headers=((b"www-authenticate", b'Bearer realm="specobs demo admin"'),),
        )
        return False

    async def _read_body(self, scope: _Scope, receive: _Receive, send: _Send) -> _Receive | None:
        """The whole body within the read deadline and the cap, as a new ``receive``; ``None``
        when the request was answered here (413, 408) or the client left."""
        cap = self.limits.max_body_bytes
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > cap:
            if int(declared) <= _DRAIN_BYTES:
                await _drain(receive, _DRAIN_BYTES, _DRAIN_SECONDS)
            await self._too_large(send, int(declared))
            return None
        deadline = time.monotonic() + self.limits.read_timeout_seconds
        body = bytearray()
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                await _send_error(
                    send, 408,
                    f"the request body did not arrive within {self.limits.read_timeout_seconds:g} "
                    f"s ({len(body)} bytes came)", code="request_timeout", close=True,
                )
                return None
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > cap:
                if message.get("more_body", False):
                    await _drain(receive, _DRAIN_BYTES, _DRAIN_SECONDS)
                await self._too_large(send, None)
                return None
            if not message.get("more_body", False):
                break
        pending: list[_Message] = [{"type": "http.request", "body": bytes(body),
                                    "more_body": False}]

        async def replay() -> _Message:
            # The body once, then the real channel (the routes watch it for a disconnect).
            return pending.pop() if pending else await receive()

        return replay

    async def _too_large(self, send: _Send, declared: int | None) -> None:
        size = f"of {declared} bytes " if declared is not None else ""
        await _send_error(
            send, 413,
            f"the request body {size}is larger than this server's limit of "
            f"{self.limits.max_body_bytes} bytes; a prompt this long could not fit the model "
            "anyway", code="request_too_large", close=True,
        )


_DRAIN_BYTES = 16 * 1024 * 1024
_DRAIN_SECONDS = 2.0


async def _drain(receive: _Receive, max_bytes: int, max_seconds: float) -> None:
    """Read and discard the rest of a refused body, bounded in bytes and time.

    Closing a connection while the client is still sending makes the kernel answer with a reset,
    which can reach the client before the 413 does: the client then sees "connection reset"
    instead of the reason. A body of sane size is read to its end first (a lingering close, as
    HTTP servers do); anything larger is cut off at once.
    """
    deadline = time.monotonic() + max_seconds
    seen = 0
    while seen <= max_bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            message = await asyncio.wait_for(receive(), left)
        except asyncio.TimeoutError:
            return
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


# -- running it -----------------------------------------------------------------------------


def _protocol(header_timeout_seconds: float) -> type[Any]:
    """uvicorn's h11 protocol with a deadline on each request's headers and JSON for its 400.

    uvicorn bounds the idle time between requests (keep-alive) but not the headers themselves:
    a client sending one byte now and then held its connection forever. Here a timer runs from
    the connection's start, and again from each response's end, until the next request's headers
    are complete; if it fires first, the connection is closed.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadlineH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the headers are in
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout_seconds, self._expired)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expired(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                # No request has started, so HTTP has no response to give: just hang up.
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            # uvicorn's own answer to bytes that are not HTTP is plain text; keep the API's shape.
            body = json.dumps(error_body(f"not a valid HTTP request: {msg}")).encode()
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return HeaderDeadlineH11Protocol


#: How long uvicorn lets requests in flight finish at shutdown before it cancels their tasks.
_GRACEFUL_SHUTDOWN_SECONDS = 4


class ServerThread:
    """Serve an ASGI app with uvicorn on a daemon thread.

    The socket is bound here, before the thread starts, so a taken port raises ``OSError`` at
    once (uvicorn would log and ``sys.exit`` inside the thread). ``port=0`` picks a free port;
    read it back from :attr:`port`. ``limits.read_timeout_seconds`` bounds each request's headers
    (the app created with the same limits bounds the body).
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 8000, *,
                 limits: ServerLimits = DEFAULT_LIMITS) -> None:
        import uvicorn

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        self.host = host
        self.port = int(sock.getsockname()[1])
        self._sock = sock
        config = uvicorn.Config(
            app, host=host, port=self.port, log_level="warning", lifespan="on",
            timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_SECONDS,
            http=_protocol(limits.read_timeout_seconds),
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run,
            kwargs={"sockets": [sock]},
            name="specobs-demo-http",
            daemon=True,
        )

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        host = "[::1]" if host == "::" else (f"[{host}]" if ":" in host else host)
        return f"http://{host}:{self.port}"

    def start(self, timeout_seconds: float = 10.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout_seconds
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the HTTP server on {self.host}:{self.port} failed to start")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the HTTP server did not start within {timeout_seconds} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout_seconds: float = 5.0, *, grace_seconds: float | None = None,
             on_grace_end: Any = None) -> None:
        """Stop accepting, let the requests in flight finish, and end the thread.

        ``on_grace_end`` (the engine's ``close``, which ends what is still queued or decoding)
        runs when requests are still in flight after ``grace_seconds``, before uvicorn's own
        graceful timeout would cancel their tasks (and log a traceback for each)."""
        self.server.should_exit = True
        if grace_seconds is not None and on_grace_end is not None and self._thread.is_alive():
            self._thread.join(min(grace_seconds, _GRACEFUL_SHUTDOWN_SECONDS / 2))
            if self._thread.is_alive():
                on_grace_end()
        if self._thread.is_alive():
            self._thread.join(timeout_seconds)
        if self._thread.is_alive():
            self.server.force_exit = True
            self._thread.join(timeout_seconds)
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *args: Any) -> None:
        self.stop()
