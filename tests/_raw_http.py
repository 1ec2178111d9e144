"""The socket plumbing the hostile HTTP servers share (tests/_hostile_server.py,
tests/_hostile_collector.py): a threaded TCP server on a free loopback port whose connections go
to :meth:`RawHttpServer._handle` with the raw socket, and the ``send``/``pause`` steps that end a
handler when the client goes away, when :meth:`RawHttpServer.close` runs, or after
``max_seconds``."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Callable

__all__ = ["Gone", "RawHttpServer"]


class Gone(Exception):
    """The client left, the server is closing, or the handler ran out of time."""


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class RawHttpServer:
    """Serves from daemon threads once :meth:`start` runs; a subclass answers in :meth:`_handle`
    and raises :class:`Gone` (or lets an ``OSError`` out) to end a connection."""

    def __init__(
        self, *, name: str, drip_seconds: float, max_seconds: float, poll_interval: float = 0.5
    ) -> None:
        self.drip_seconds = drip_seconds
        self.max_seconds = max_seconds
        self.closing = threading.Event()
        self._lock = threading.Lock()
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    owner._handle(self.request)
                except (Gone, OSError):
                    pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": poll_interval},
            name=name, daemon=True,
        )  # fmt: skip

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, sock: socket.socket) -> None:
        raise NotImplementedError

    def _sender(
        self, sock: socket.socket, sent: Callable[[int], None] | None = None
    ) -> Callable[[bytes], None]:
        """``send(data)`` for one response, started now: raises :class:`Gone` once closing or
        ``max_seconds`` in, or when the client is gone; ``sent(n)`` hears of each send."""
        started = time.monotonic()

        def send(data: bytes) -> None:
            if self.closing.is_set() or time.monotonic() - started > self.max_seconds:
                raise Gone
            try:
                sock.sendall(data)
            except OSError:
                raise Gone from None
            if sent is not None:
                sent(len(data))

        return send

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds``; :class:`Gone` if the server closes meanwhile."""
        if self.closing.wait(seconds):
            raise Gone
