"""The metrics endpoint inside the inference process: one thread, bounded, with deadlines.

``prometheus_client.start_http_server`` starts a thread per connection and never times a client
out, so 300 slow clients meant 300 threads in the inference process. This server is one daemon
thread around a ``selectors`` loop:

* at most ``max_connections`` connections at once. When all are taken, a newcomer is not turned
  away: it evicts the connection that has been quiet the longest (one still sending its request
  head before one not taking its response; a slow head that keeps arriving is not quiet), and
  the listener then rests ``full_accept_interval_seconds`` before the next admission, so a client
  that reconnects as fast as it is evicted costs at most about a hundred accepts a second, and a
  newcomer outlives that many admissions before it can be evicted in turn. Counted in
  :attr:`MetricsServer.evicted`; :attr:`MetricsServer.refused` counts every connection closed for
  want of a slot (the evicted, and a newcomer that could not be admitted);
* a whole request head must arrive within ``read_timeout_seconds`` (a deadline for the request,
  not per read, so a client dripping a byte at a time is cut off too) and be at most 16 KiB;
  the response must be taken within ``write_timeout_seconds``; one request per connection
  (:attr:`MetricsServer.timed_out`);
* when ``accept()`` fails for want of file descriptors or memory (``EMFILE``, ``ENFILE``,
  ``ENOBUFS``, ``ENOMEM``, or any error that is not about one connection) the listener stays
  readable, so selecting it again would spin: the thread stops selecting it for 10 ms, doubling
  to 1 s while the failures last, and tries again at once when it closes a connection of its own
  (which freed a descriptor). Counted in :attr:`MetricsServer.accept_failures`, logged once a
  minute at most; connections that arrive meanwhile wait in the kernel's queue;
* existing connections are read before newcomers are accepted, and a newcomer's head is read at
  once when it is already there;
* the body comes from ``render(accept, accept_encoding)``, which the sink caches;
* the thread's own CPU time (parsing, rendering, compressing, sending) is handed to ``on_cpu``
  after each turn of the loop, so the exporter's self-reported cost is the whole cost.

Only the standard library; nothing here touches the hot path.
"""

from __future__ import annotations

import errno
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
#: Accepts tried in one turn of the loop at most (the listen backlog); the rest wait a turn.
_ACCEPTS_PER_TURN = 64
#: The listener's rest after an ``accept()`` failure that is not about one connection: the first,
#: and the cap it doubles to while the failures last.
_BACKOFF_FIRST_SECONDS = 0.01
_BACKOFF_MAX_SECONDS = 1.0
#: ``accept()`` errors that concern one pending connection (Linux reports some network errors
#: of the new connection there): take the next one. Any other error backs off.
_ACCEPT_SKIP = frozenset(
    getattr(errno, name) for name in (
        "ECONNABORTED", "EPROTO", "EPERM", "ENETDOWN", "ENOPROTOOPT", "EHOSTDOWN", "ENONET",
        "EHOSTUNREACH", "EOPNOTSUPP", "ENETUNREACH", "ECONNRESET",
    ) if hasattr(errno, name)
)
_LOG_EVERY_SECONDS = 60.0

#: ``render(accept, accept_encoding)`` -> (status, content type, body, content encoding or "").
Render = Callable[[str, str], tuple[int, str, bytes, str]]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large",
            500: "Internal Server Error"}


class _Conn:
    __slots__ = ("active", "buf", "closed", "deadline", "out", "sock", "writing")

    def __init__(self, sock: socket.socket, now: float, deadline: float) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.deadline = deadline
        self.out = memoryview(b"")
        self.writing = False
        self.closed = False
        #: When the client last sent a byte or took one (or connected): eviction picks the
        #: connection quiet the longest, so a slow head that keeps coming is not taken for idle.
        self.active = now


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
        full_accept_interval_seconds: float = 0.01,
        name: str = "specobs-prometheus",
    ) -> None:
        self.addr = addr
        self._render = render
        self._on_cpu = on_cpu
        self._cpu0 = 0.0  # thread CPU already handed to on_cpu (set when the thread starts)
        self.max_connections = max_connections
        self.read_timeout_seconds = read_timeout_seconds
        self.write_timeout_seconds = write_timeout_seconds
        self.full_accept_interval_seconds = full_accept_interval_seconds
        #: Connections closed for want of a slot: the evicted, and newcomers not admitted.
        self.refused = 0
        #: Connections evicted (quiet the longest) to admit a newcomer when all slots were taken.
        self.evicted = 0
        #: Connections closed at their head or response deadline.
        self.timed_out = 0
        #: ``accept()`` calls that failed for want of descriptors or memory; each rests the
        #: listener (10 ms, doubling to 1 s while it lasts).
        self.accept_failures = 0
        self.requests = 0
        self._listening = True
        self._resume_at = 0.0
        self._backoff = 0.0
        self._logged: dict[str, tuple[float, int]] = {}
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
    def _flush_cpu(self) -> None:
        """Hand the thread's CPU since the last call to ``on_cpu``."""
        cpu1 = time.thread_time()
        if cpu1 > self._cpu0:
            self._on_cpu(cpu1 - self._cpu0)
            self._cpu0 = cpu1

    def _run(self) -> None:
        self._cpu0 = time.thread_time()
        try:
            while not self._stop:
                now = time.monotonic()
                if not self._listening and now >= self._resume_at:
                    self._listen()
                # Newcomers last: a head that arrived in this turn counts before an eviction.
                if self._serve(self._sel.select(self._timeout(now))):
                    self._accept()
                now = time.monotonic()
                for c in [c for c in self._conns.values() if c.deadline <= now]:
                    self.timed_out += 1
                    self._close(c)
                self._flush_cpu()
        except Exception as exc:  # never a traceback from a daemon thread in the engine
            _log.warning("specobs: the metrics endpoint stopped: %r", exc)
        finally:
            if self._stop:
                # shutdown() closes the sockets only if the thread ended within its timeout;
                # a thread that ends later (a loaded machine) closes them itself, or they would
                # be freed open with the thread's frame.
                self._close_all()

    def _timeout(self, now: float) -> float:
        """How long one turn may wait: until the listener resumes or a connection's deadline,
        at most 1 s."""
        timeout = 1.0
        if not self._listening:
            timeout = min(timeout, self._resume_at - now)
        if self._conns:
            timeout = min(timeout, min(c.deadline for c in self._conns.values()) - now)
        return max(0.0, timeout)

    def _serve(self, events: list[tuple[selectors.SelectorKey, int]]) -> bool:
        """Read and write what is ready; True when the listener has a newcomer waiting."""
        accept = False
        for key, mask in events:
            data = key.data
            if data is None:
                accept = True
            elif data == "wake":
                try:
                    self._wake_r.recv(64)
                except OSError:
                    pass
            elif data.closed:  # evicted earlier in this turn
                continue
            elif mask & selectors.EVENT_READ and not data.writing:
                self._read(data)
            elif mask & selectors.EVENT_WRITE:
                self._write(data)
        return accept

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                self._backoff = 0.0  # the listener works: a later failure is a new episode
                return
            except OSError as exc:
                if exc.errno in _ACCEPT_SKIP:
                    _log.debug("specobs: accept failed: %r", exc)
                    continue
                self._back_off(exc)
                return
            self._backoff = 0.0
            full = len(self._conns) >= self.max_connections
            if full and not self._evict():
                self.refused += 1
                sock.close()
            else:
                self._admit(sock)
            if full:
                # One admission per interval while full: a client reconnecting as fast as it
                # is evicted gets a bounded rate, and the newcomer lives that many intervals.
                self._pause(self.full_accept_interval_seconds)
                return

    def _admit(self, sock: socket.socket) -> None:
        now = time.monotonic()
        c = _Conn(sock, now, now + self.read_timeout_seconds)
        try:
            sock.setblocking(False)
            self._sel.register(sock, selectors.EVENT_READ, c)
        except (OSError, ValueError):
            self.refused += 1
            sock.close()
            return
        self._conns[id(c)] = c
        # The head is often there already: no turn of the loop for it. The CPU spent so far in
        # this turn is counted first, so the response reports it (as it did when every request
        # waited for the next turn).
        self._flush_cpu()
        self._read(c)

    def _evict(self) -> bool:
        """Close the connection quiet the longest, still-reading ones first; False if none."""
        victim: _Conn | None = None
        for c in self._conns.values():
            if victim is None or (c.writing, c.active) < (victim.writing, victim.active):
                victim = c
        if victim is None:
            return False
        self.evicted += 1
        self.refused += 1
        self._close(victim)
        self._note("full", f"the metrics endpoint has all {self.max_connections} connections "
                           "taken; each newcomer evicts the one quiet the longest (counted in "
                           "MetricsServer.evicted); something holds connections open without "
                           "finishing its requests")
        return True

    def _back_off(self, exc: OSError) -> None:
        self.accept_failures += 1
        first = self._backoff == 0.0
        self._backoff = (_BACKOFF_FIRST_SECONDS if first
                         else min(self._backoff * 2, _BACKOFF_MAX_SECONDS))
        self._pause(self._backoff)
        if first:
            self._note("accept", f"the metrics endpoint cannot accept connections: "
                                 f"{exc.strerror or exc!r}; it stops accepting for "
                                 f"{_BACKOFF_FIRST_SECONDS * 1000:g} ms, doubling to "
                                 f"{_BACKOFF_MAX_SECONDS:g} s, until it can (counted in "
                                 "MetricsServer.accept_failures). Raise the process's file "
                                 "descriptor limit (ulimit -n) or find what holds them")

    def _pause(self, seconds: float) -> None:
        """Stop selecting the listener for ``seconds``: pending connections wait in the kernel."""
        if self._listening:
            try:
                self._sel.unregister(self._sock)
            except (KeyError, ValueError, OSError):
                pass
            self._listening = False
        self._resume_at = time.monotonic() + seconds

    def _listen(self) -> None:
        try:
            self._sel.register(self._sock, selectors.EVENT_READ, None)
        except KeyError:
            pass
        except OSError as exc:  # epoll_ctl out of memory: as an accept failure
            self._back_off(exc)
            return
        self._listening = True

    def _note(self, kind: str, message: str) -> None:
        """Log ``message`` once, then at most once a minute with a count of the ones skipped."""
        now = time.monotonic()
        seen = self._logged.get(kind)
        if seen is not None and now - seen[0] < _LOG_EVERY_SECONDS:
            self._logged[kind] = (seen[0], seen[1] + 1)
            return
        skipped = 0 if seen is None else seen[1]
        self._logged[kind] = (now, 0)
        extra = f" ({skipped} similar messages suppressed)" if skipped else ""
        _log.warning("specobs: %s%s", message, extra)

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
        c.active = time.monotonic()
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
        if sent:
            c.active = time.monotonic()
        if not c.out:
            self._close(c)

    def _close(self, c: _Conn) -> None:
        c.closed = True
        if self._backoff and not self._listening:
            self._resume_at = 0.0  # a descriptor was freed: try the listener again now
        self._conns.pop(id(c), None)
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError, OSError):
            pass
        try:
            c.sock.close()
        except OSError:
            pass

