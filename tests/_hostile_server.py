"""A hostile HTTP server for the terminal tools' tests (``specobs top``, ``specobs doctor``).

It speaks HTTP/1.1 from a raw socket, so every byte and every pause is under the test's control.
The first path segment picks the behaviour; the rest of the path is ignored, so ``/endless`` also
works as a Prometheus base URL (``/endless/api/v1/query``):

=============  ================================================================================
/endless       200, chunked, fast metric-like lines that never end
/slowdrip      200, then two bytes of body every ``drip_seconds``, never ending
/slowheaders   the status line and headers one byte every ``drip_seconds``, never finishing
/silent        reads the request and never answers
/gzipbomb      200, ``Content-Encoding: gzip``: a ~200 KiB body that inflates to 200 MiB
/hugeline      200, chunked: one 50 MB line of metric text with no newline
/biglength     200 with ``Content-Length`` 50 MB, sent fast
/garbage       200, random bytes
/redirectbomb  302 to itself with a ``Location`` and a never-ending body
=============  ================================================================================

Every handler stops when the client goes away, when :meth:`HostileServer.close` runs, or after
``max_seconds``, so a broken client cannot leave it spinning. :attr:`HostileServer.hits` counts
requests per behaviour.
"""

from __future__ import annotations

import collections
import functools
import os
import socket
import time
import zlib
from collections.abc import Iterator

import pytest

from tests._raw_http import RawHttpServer

__all__ = [
    "BOMB_BYTES", "HUGE_BYTES", "HostileServer", "Measured", "hostile_server", "run_measured",
]

#: What the gzip bomb inflates to.
BOMB_BYTES = 200 * 1024 * 1024
#: Size of /hugeline and of /biglength's announced body.
HUGE_BYTES = 50 * 1000 * 1000
_LINE = b'specobs_cycles_total{model="hostile",pad="' + b"x" * 64 + b'"} 1\n'


@functools.cache
def _gzip_bomb() -> bytes:
    """~200 KiB of gzip inflating to :data:`BOMB_BYTES` (made once per process, ~1 s)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"0" * (1024 * 1024)
    parts = [z.compress(block) for _ in range(BOMB_BYTES // len(block))]
    parts.append(z.flush())
    return b"".join(parts)


class HostileServer(RawHttpServer):
    """The server on a free loopback port, serving from daemon threads."""

    def __init__(self, drip_seconds: float = 0.2, max_seconds: float = 60.0) -> None:
        self.hits: collections.Counter[str] = collections.Counter()
        super().__init__(name="hostile-server", drip_seconds=drip_seconds, max_seconds=max_seconds)
        self.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def bomb(self) -> bytes:
        with self._lock:
            return _gzip_bomb()

    # -- one connection ---------------------------------------------------------------------

    def _handle(self, sock: socket.socket) -> None:
        sock.settimeout(5)
        request = b""
        while b"\r\n\r\n" not in request and len(request) < 65536:
            chunk = sock.recv(4096)
            if not chunk:
                return
            request += chunk
        parts = request.split(b" ", 2)
        path = parts[1].decode("latin-1") if len(parts) > 1 else "/"
        mode = path.split("?")[0].strip("/").split("/")[0]
        with self._lock:
            self.hits[mode] += 1
        send, pause = self._sender(sock), self._pause

        def head(status: str, *headers: str) -> bytes:
            lines = [f"HTTP/1.1 {status}", "Connection: close", *headers, "", ""]
            return "\r\n".join(lines).encode("latin-1")

        def chunk(data: bytes) -> bytes:
            return f"{len(data):x}\r\n".encode() + data + b"\r\n"

        plain = "Content-Type: text/plain; version=0.0.4"
        chunked = "Transfer-Encoding: chunked"
        if mode == "endless":
            send(head("200 OK", plain, chunked))
            block = chunk(_LINE * 1000)
            while True:
                send(block)
        elif mode == "slowdrip":
            send(head("200 OK", plain, chunked))
            while True:
                send(chunk(b"# "))
                pause(self.drip_seconds)
        elif mode == "slowheaders":
            for byte in head("200 OK", plain, "X-Slow: " + "s" * 10000):
                send(bytes([byte]))
                pause(self.drip_seconds)
        elif mode == "silent":
            pause(self.max_seconds)
        elif mode == "gzipbomb":
            body = self.bomb()
            send(head("200 OK", plain, "Content-Encoding: gzip",
                      f"Content-Length: {len(body)}") + body)
        elif mode == "hugeline":
            send(head("200 OK", plain, chunked))
            send(chunk(b'specobs_info{pad="'))
            block = b"x" * (1024 * 1024)
            for _ in range(HUGE_BYTES // len(block)):
                send(chunk(block))
            send(chunk(b'"} 1') + b"0\r\n\r\n")
        elif mode == "biglength":
            send(head("200 OK", plain, f"Content-Length: {HUGE_BYTES}"))
            block = _LINE * 1000
            sent = 0
            while sent < HUGE_BYTES:
                piece = block[: HUGE_BYTES - sent]
                send(piece)
                sent += len(piece)
        elif mode == "garbage":
            body = os.urandom(200_000)
            send(head("200 OK", plain, f"Content-Length: {len(body)}") + body)
        elif mode == "redirectbomb":
            send(head("302 Found", f"Location: {path}", plain, chunked))
            block = chunk(_LINE * 1000)
            while True:
                send(block)
        else:
            send(head("404 Not Found", plain, "Content-Length: 10") + b"not found\n")


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[HostileServer]:
    server = HostileServer()
    server.bomb()  # made before any test's clock runs
    try:
        yield server
    finally:
        server.close()


class Measured:
    """What :func:`run_measured` saw: exit status, output, wall seconds and peak RSS."""

    def __init__(self, returncode: int, output: str, seconds: float, peak_rss_mb: float) -> None:
        self.returncode = returncode
        self.output = output
        self.seconds = seconds
        self.peak_rss_mb = peak_rss_mb

    def __repr__(self) -> str:
        return (f"Measured(rc={self.returncode}, {self.seconds:.1f} s, {self.peak_rss_mb:.0f} MB, "
                f"output={self.output[-2000:]!r})")


# The command runs under this bootstrap, which writes the process's own VmHWM (peak resident
# memory of its address space, which exec resets) when it exits. wait4's ru_maxrss would not do:
# it includes the pages the child shared with this (large) test process before exec.
_BOOTSTRAP = """
import atexit, os, sys
def _peak():
    with open("/proc/self/status") as f:
        kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(os.environ["SPECOBS_TEST_PEAK_FILE"], "w") as out:
        out.write(kib)
atexit.register(_peak)
from specobs.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _vm_hwm_kib(path: str) -> int:
    try:
        with open(path) as f:
            return int(next(line.split()[1] for line in f if line.startswith("VmHWM:")))
    except (OSError, StopIteration, ValueError):
        return 0


def run_measured(args: list[str], *, env: dict[str, str], cwd: str, kill_after: float
                 ) -> Measured:
    """Run ``specobs ARGS`` to its end, or kill it after ``kill_after`` seconds (then
    ``returncode`` is -9), and measure its wall time and peak RSS (the figure it reports at exit,
    or the highest seen while polling /proc when it had to be killed)."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        peak_file = os.path.join(tmp, "peak")
        out_path = os.path.join(tmp, "out")
        env = dict(env, SPECOBS_TEST_PEAK_FILE=peak_file)
        with open(out_path, "wb") as out:
            started = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-c", _BOOTSTRAP, *args], stdout=out,
                                    stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                    stdin=subprocess.DEVNULL)
            polled = 0
            while True:
                try:
                    returncode = proc.wait(0.02)
                    break
                except subprocess.TimeoutExpired:
                    polled = max(polled, _vm_hwm_kib(f"/proc/{proc.pid}/status"))
                if time.monotonic() - started > kill_after:
                    proc.kill()
                    returncode = proc.wait()
                    break
            seconds = time.monotonic() - started
        with open(out_path, "rb") as f:
            output = f.read().decode("utf-8", "replace")
        try:
            with open(peak_file) as f:
                reported = int(f.read().strip() or 0)
        except (OSError, ValueError):
            reported = 0
    return Measured(returncode, output, seconds, max(polled, reported) / 1024)
