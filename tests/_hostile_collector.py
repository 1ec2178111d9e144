"""A hostile OTLP/HTTP collector for the OTLP sink's tests, speaking HTTP/1.1 from a raw socket.

It reads each export request whole (head and ``Content-Length`` body), then answers according to
its ``mode``, which may be changed while it runs:

=============  ================================================================================
``endless``    200, chunked, a fast body that never ends
``biglength``  200 with ``Content-Length`` 1 GiB, sent fast
``drip``       200 and its head at once, then one byte of chunked body every ``drip_seconds``
``slowhead``   the status line and headers one byte every ``drip_seconds``, never finishing
``redirect``   307 to ``https://collector.invalid/v1/...`` with an empty body (an ``http://``
               endpoint that moved to ``https://``)
``ok``         200 with an empty ``ExportServiceResponse`` (an empty protobuf message)
=============  ================================================================================

A handler stops when the client goes away, when :meth:`HostileCollector.close` runs, or after
``max_seconds``, so a client that never hangs up cannot leave it spinning. :attr:`requests`
counts the requests answered; :attr:`bytes_sent` counts, per request, the response bytes the
kernel accepted (what the client read plus what socket buffers held when it hung up).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import closing

import pytest

from tests._raw_http import RawHttpServer

__all__ = ["HostileCollector", "hostile_collector"]


class HostileCollector(RawHttpServer):
    """The collector on a free loopback port; :attr:`endpoint` is its OTLP/HTTP base URL."""

    def __init__(self, mode: str = "ok", *, drip_seconds: float = 0.5,
                 max_seconds: float = 30.0) -> None:
        self.mode = mode
        self._sent: list[int] = []
        super().__init__(name="hostile-collector", drip_seconds=drip_seconds,
                         max_seconds=max_seconds, poll_interval=0.05)  # fmt: skip
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.start()

    @property
    def requests(self) -> int:
        with self._lock:
            return len(self._sent)

    @property
    def bytes_sent(self) -> list[int]:
        with self._lock:
            return list(self._sent)

    # -- one connection (keep-alive: one request after another) -----------------------------

    def _handle(self, sock: socket.socket) -> None:
        sock.settimeout(5)
        pending = b""
        while not self.closing.is_set():
            while b"\r\n\r\n" not in pending:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                pending += chunk
            head, _, pending = pending.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            while len(pending) < length:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                pending += chunk
            pending = pending[length:]
            with self._lock:
                index = len(self._sent)
                self._sent.append(0)
            self._answer(sock, index)

    def _answer(self, sock: socket.socket, index: int) -> None:
        def sent(n: int) -> None:
            with self._lock:
                self._sent[index] += n

        send = self._sender(sock, sent)

        def pause() -> None:
            self._pause(self.drip_seconds)

        proto = "Content-Type: application/x-protobuf"
        chunked = "Transfer-Encoding: chunked"

        def head(*headers: str) -> bytes:
            return "\r\n".join(["HTTP/1.1 200 OK", proto, *headers, "", ""]).encode("latin-1")

        mode = self.mode
        if mode == "endless":
            send(head(chunked))
            block = b"\x00" * 65536
            piece = f"{len(block):x}\r\n".encode() + block + b"\r\n"
            while True:
                send(piece)
        elif mode == "biglength":
            send(head(f"Content-Length: {1 << 30}"))
            block = b"\x00" * 65536
            while True:
                send(block)
        elif mode == "drip":
            send(head(chunked))
            while True:
                send(b"1\r\n\x00\r\n")
                pause()
        elif mode == "slowhead":
            for byte in head(chunked, "X-Slow: " + "s" * 10000):
                send(bytes([byte]))
                pause()
        elif mode == "redirect":
            send("\r\n".join([
                "HTTP/1.1 307 Temporary Redirect",
                "Location: https://collector.invalid:4318/v1/traces", "Content-Length: 0", "", "",
            ]).encode("latin-1"))
        else:
            send(head("Content-Length: 0"))


@pytest.fixture
def hostile_collector() -> Iterator[HostileCollector]:
    """A :class:`HostileCollector` in mode ``ok`` (set ``.mode``), closed after the test."""
    with closing(HostileCollector()) as collector:
        yield collector
