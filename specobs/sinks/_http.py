"""The metrics endpoint inside the inference process: one thread, bounded, with deadlines.

``prometheus_client.start_http_server`` starts a thread per connection and never times a client
out, so 300 slow clients meant 300 threads in the inference process. This server is one daemon
thread around a ``selectors`` loop:

* at most ``max_connections`` connections at once; a connection beyond that is closed at once
  (counted in :attr:`MetricsServer.refused`);
* a whole request head must arrive within ``read_timeout_seconds`` (a deadline for the request,
  not per read, so a client dripping a byte at a time is cut off too) and be at most 16 KiB;
  the response must be taken within ``write_timeout_seconds``; one request per connection;
* the body comes from ``render(accept, accept_encoding)``, which the sink caches;
* the thread's own CPU time (parsing, rendering, compressing, sending) is handed to ``on_cpu``
  after each turn of the loop, so the exporter's self-reported cost is the whole cost.

Only the standard library; nothing here touches the hot path.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["MetricsServer"]

_log = logging.getLogger("specobs")
_MAX_HEAD_BYTES = 16 * 1024

#: ``render(accept, accept_encoding)`` -> (status, content type, body, content encoding or "").
Render = Callable[[str, str], tuple[int, str, bytes, str]]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large",
            500: "Internal Server Error"}


class _Conn:
    __slots__ = ("buf", "deadline", "out", "sock", "writing")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.deadline = deadline
        self.out = memoryview(b"")
        self.writing = False


class MetricsServer:
    """Serve ``render``'s output over HTTP/1.1 on ``(addr, port)`` from one daemon thread."""

    def __init__(
        self,
        addr: str,
        port: int,
        render: Render,
        on_cpu: Callable[[float], None],
        *,
        max_connections: int = 32,
        read_timeout_seconds: float = 5.0,
        write_timeout_seconds: float = 10.0,
        name: str = "specobs-prometheus",
    ) -> None:
        self.addr = addr
        self._render = render
        self._on_cpu = on_cpu
        self.max_connections = max_connections
        self.read_timeout_seconds = read_timeout_seconds
        self.write_timeout_seconds = write_timeout_seconds
        self.refused = 0
        self.timed_out = 0
        self.requests = 0
        info = socket.getaddrinfo(addr or None, port, type=socket.SOCK_STREAM,
                                  flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        try:
            if os.name == "posix":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(info[4])
            sock.listen(64)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.port: int = sock.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(sock, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[int, _Conn] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def connections(self) -> int:
        """Connections open now (for tests and diagnostics)."""
        return len(self._conns)

    def shutdown(self, timeout_seconds: float) -> None:
        """Stop serving and close every socket; bounded by ``timeout_seconds``."""
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, timeout_seconds))
        if not self._thread.is_alive():
            self._close_all()

    def abandon_in_child(self) -> None:
        """After ``fork()`` in the child: the thread does not exist here; close this process's
        copies of the sockets without shutting them down (the parent still serves on them)."""
        self._stop = True
        self._close_all()

    def _close_all(self) -> None:
        for c in list(self._conns.values()):
            self._close(c)
        for s in (self._sock, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        try:
            self._sel.close()
        except Exception:
            pass

    # -- the loop --------------------------------------------------------------------------------
    def _run(self) -> None:
        cpu0 = time.thread_time()
        try:
            while not self._stop:
                timeout = 1.0
                if self._conns:
                    nearest = min(c.deadline for c in self._conns.values())
                    timeout = max(0.0, min(timeout, nearest - time.monotonic()))
                events = self._sel.select(timeout)
                for key, mask in events:
                    if key.data == "wake":
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                    elif key.data is None:
                        self._accept()
                    elif mask & selectors.EVENT_READ and not key.data.writing:
                        self._read(key.data)
                    elif mask & selectors.EVENT_WRITE:
                        self._write(key.data)
                now = time.monotonic()
                for c in [c for c in self._conns.values() if c.deadline <= now]:
                    self.timed_out += 1
                    self._close(c)
                cpu1 = time.thread_time()
                if cpu1 > cpu0:
                    self._on_cpu(cpu1 - cpu0)
                    cpu0 = cpu1
        except Exception as exc:  # never a traceback from a daemon thread in the engine
            _log.warning("specobs: the metrics endpoint stopped: %r", exc)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                _log.debug("specobs: accept failed: %r", exc)
                return
            if len(self._conns) >= self.max_connections:
                self.refused += 1
                sock.close()
                continue
            sock.setblocking(False)
            c = _Conn(sock, time.monotonic() + self.read_timeout_seconds)
            self._conns[id(c)] = c
            self._sel.register(sock, selectors.EVENT_READ, c)

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(c)
            return
        if not data:
            self._close(c)
            return
        c.buf += data
        end = c.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(c.buf) > _MAX_HEAD_BYTES:
                self._respond(c, 431, "text/plain; charset=utf-8", b"request head too large\n")
            return
        self._handle(c, bytes(c.buf[:end]))

    def _handle(self, c: _Conn, head: bytes) -> None:
        self.requests += 1
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._respond(c, 400, "text/plain; charset=utf-8", b"bad request line\n")
            return
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            self._respond(c, 405, "text/plain; charset=utf-8", b"only GET and HEAD\n")
            return
        if target.split("?", 1)[0] == "/favicon.ico":
            self._respond(c, 404, "text/plain; charset=utf-8", b"not found\n")
            return
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        try:
            status, ctype, body, encoding = self._render(
                headers.get("accept", ""), headers.get("accept-encoding", "")
            )
        except Exception as exc:
            _log.warning("specobs: rendering metrics failed: %r", exc)
            status, ctype, body, encoding = (
                500, "text/plain; charset=utf-8", b"rendering failed\n", ""
            )
        self._respond(c, status, ctype, body, encoding, head_only=method == "HEAD")

    def _respond(self, c: _Conn, status: int, ctype: str, body: bytes, encoding: str = "",
                 *, head_only: bool = False) -> None:
        extra = f"Content-Encoding: {encoding}\r\n" if encoding else ""
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n").encode()
        c.out = memoryview(head if head_only else head + body)
        c.writing = True
        c.deadline = time.monotonic() + self.write_timeout_seconds
        try:
            self._sel.modify(c.sock, selectors.EVENT_WRITE, c)
        except (KeyError, ValueError, OSError):
            self._close(c)
            return
        self._write(c)

    def _write(self, c: _Conn) -> None:
        try:
            sent = c.sock.send(c.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(c)
            return
        c.out = c.out[sent:]
        if not c.out:
            self._close(c)

    def _close(self, c: _Conn) -> None:
        self._conns.pop(id(c), None)
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError, OSError):
            pass
        try:
            c.sock.close()
        except OSError:
            pass

