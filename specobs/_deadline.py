"""A wall-clock deadline for one blocking network request: a timer shuts its sockets down.

Client libraries' timeouts are per socket operation, so a peer that sends one byte at a time
holds a request for as long as it likes. ``shutdown()`` (not ``close()``) is what wakes a ``recv``
blocked in another thread; the client then sees the peer gone, and the caller reports the
deadline instead. Used by the tools' HTTP client (httpx) and the OTLP/HTTP exporter's session
(requests); stdlib only.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import TypeVar

_D = TypeVar("_D", bound="SocketDeadline")

__all__ = ["SocketDeadline", "shutdown_socket"]


class SocketDeadline:
    """The sockets of one request, shut down by a timer ``seconds`` from now.

    The timer starts at construction; :meth:`finish` (or leaving the ``with`` block) cancels it
    and forgets the sockets, so a connection returned to its pool is never cut afterwards.
    """

    def __init__(self, seconds: float, *, name: str = "specobs-deadline") -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._done = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.name = name
        self._timer.start()

    def __enter__(self: _D) -> _D:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def left(self) -> float:
        return self.at - time.monotonic()

    def passed(self) -> bool:
        return self.expired or self.left() <= 0

    def watch_socket(self, sock: object) -> None:
        """Cut ``sock`` at the deadline (at once if it has passed); anything else is ignored."""
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            shutdown_socket(sock)

    def finish(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._done = True
            self._sockets.clear()

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return  # the request ended meanwhile: its socket may be back in the pool
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            shutdown_socket(sock)


def shutdown_socket(sock: socket.socket) -> None:
    try:
        # socket.socket's own method also for an SSLSocket: it only cuts the connection.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass
