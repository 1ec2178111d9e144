"""Bounded HTTP GETs for the terminal tools: a total deadline and a cap on the decoded body.

``specobs top`` and ``specobs doctor`` read endpoints they do not control. A plain
``client.get(url)`` trusts the server: httpx keeps the whole body in memory, inflates gzip without
limit, follows redirects by reading every hop's body, and its timeout bounds one socket read, so
a body that trickles a byte every few seconds never ends. :func:`get` removes that trust:

* **One deadline per request** (``timeout_seconds``), from the first connect to the last byte,
  redirects included. httpx's timeout still bounds each read; a timer thread bounds the whole:
  at the deadline it shuts down the request's sockets (taken from httpx's documented ``trace`` and
  ``network_stream`` extensions), which wakes the blocked read at once. Between chunks the
  deadline is checked as well.
* **A cap on the decoded body** (``max_bytes``). The raw stream is inflated here with ``zlib``
  and an output limit per chunk, so a 200 KB gzip bomb stops at the cap instead of becoming
  gigabytes; a declared ``Content-Length`` over the cap is refused before any body is read.
* **Redirects followed here** (at most :data:`MAX_REDIRECTS`), never reading a redirect's body.

Every failure is a :class:`ScrapeError` whose ``str()`` is one line for the user. httpx is
imported inside :func:`get`: importing this module costs nothing.

A URL may carry credentials (``http://user:password@host:9477/metrics``): httpx sends them as HTTP
Basic authentication, and :func:`display_url` strips them from the URL everywhere the tools show
or keep one (messages, report titles, snapshot files).
"""

from __future__ import annotations

import argparse
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specobs._deadline import SocketDeadline

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_TIMEOUT_SECONDS",
    "MAX_REDIRECTS",
    "REDACTED",
    "Fetched",
    "Limits",
    "ScrapeError",
    "add_limit_arguments",
    "add_source_arguments",
    "display_url",
    "file_limit",
    "format_bytes",
    "get",
    "http_client",
    "limits_from",
    "parse_byte_size",
    "scrub",
]

#: Largest response body read, counted after decompression. A specobs endpoint serves tens of
#: KiB and one Prometheus query result less; 16 MiB leaves room for big multi-observer endpoints.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
#: Largest snapshot file ``specobs report`` reads (``--from FILE``, ``--max-bytes`` for a
#: file), counted after decompression: a day of ``--save`` at one scrape every 2 s is about
#: 1 GiB. The file is read in one pass and thinned to a bounded number of snapshots.
DEFAULT_MAX_FILE_BYTES = 2 * 1024**3
#: Deadline of one request: connect, headers, body and redirects together.
DEFAULT_TIMEOUT_SECONDS = 5.0
#: Redirect hops followed per request.
MAX_REDIRECTS = 10
#: Bytes of an error response's body read for its one-line message.
_ERROR_BODY_BYTES = 4096
_CHUNK_BYTES = 64 * 1024


class ScrapeError(Exception):
    """A scrape or a Prometheus query failed; ``str()`` is one line meant for the user."""


@dataclass(frozen=True)
class Limits:
    """What one request may cost: its deadline in seconds and its decoded body in bytes."""

    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    max_bytes: int = DEFAULT_MAX_BYTES


#: The limits of a request when the caller gives none.
DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Fetched:
    """One response: status, reason, headers and the decoded body (whole for a 2xx, the first
    few KiB otherwise)."""

    status_code: int
    reason_phrase: str
    headers: Mapping[str, str]
    body: bytes
    url: str


#: ``scheme://`` and the userinfo of the authority: everything up to its last ``@``. The
#: authority ends at the first ``/``, ``?`` or ``#``, as ``urllib.parse.urlsplit`` and httpx
#: (RFC 3986) read it.
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#]*@")


#: One ``name=value`` parameter of a query string or a fragment, up to the next ``&`` or
#: ``;`` (the value may be empty or absent).
_PARAMETER = re.compile(r"(?P<name>[^&;=#]*)(?P<eq>=?)(?P<value>[^&;#]*)")
#: Parameter names (lower case, ``-`` and ``_`` dropped) that name a credential, and the parts
#: that make any name one: ``access_token``, ``X-Api-Key``, ``client_secret``, ``sig``.
_SECRET_NAMES = frozenset({"key", "sig", "code", "pass", "pw", "auth", "jwt"})
_SECRET_PARTS = ("token", "secret", "password", "passwd", "pwd", "apikey", "accesskey",
                 "credential", "signature", "session", "authorization", "privatekey")
#: What a redacted parameter's value shows instead.
REDACTED = "REDACTED"


def _is_secret_name(name: str) -> bool:
    from urllib.parse import unquote_plus

    key = unquote_plus(name).lower().replace("-", "").replace("_", "")
    return key in _SECRET_NAMES or any(part in key for part in _SECRET_PARTS)


def _redacted_parameters(text: str) -> str:
    """``text`` (a query string or a fragment) with the value of each parameter whose name looks
    like a credential replaced by :data:`REDACTED`; the rest kept byte for byte."""

    def one(m: re.Match[str]) -> str:
        if m.group("eq") and m.group("value") and _is_secret_name(m.group("name")):
            return f"{m.group('name')}={REDACTED}"
        return m.group(0)

    return _PARAMETER.sub(one, text)


def scrub(text: str, url: str) -> str:
    """``text`` (a message that may quote what a server sent back, or an exception's words)
    with every credential of ``url`` -- its userinfo's password, each credential-like
    parameter's value, as given or percent-decoded -- replaced by :data:`REDACTED`."""
    from urllib.parse import unquote, unquote_plus, urlsplit

    found: list[str] = []
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        found.append(password)
    for part in (url.partition("#")[0].partition("?")[2], url.partition("#")[2]):
        for m in _PARAMETER.finditer(part):
            if m.group("eq") and m.group("value") and _is_secret_name(m.group("name")):
                value = m.group("value")
                found += [value, unquote(value), unquote_plus(value)]
    # Longest first, so a secret that contains another is replaced whole; short values (a
    # "1" flag) are left alone rather than blanking every digit of the message.
    for secret in sorted({f for f in found if len(f) >= 4}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def display_url(url: str) -> str:
    """``url`` as the tools show it: without its userinfo (``http://alice:pw@host:9477/metrics``
    → ``http://host:9477/metrics``), and with the value of every query or fragment parameter
    whose name looks like a credential (``access_token``, ``api_key``, ``X-Amz-Signature``,
    ``password``, ...) replaced by ``REDACTED``; a URL with neither is returned as it is.

    Every URL the tools print, save or put in a title goes through this: a report or a snapshot
    file is meant to be shared, and a password or a token in it would go along. The request
    keeps them (httpx sends userinfo as HTTP Basic authentication, and the query as given).
    """
    url = _USERINFO.sub(r"\1", url, count=1)
    if "?" not in url and "#" not in url:
        return url
    head, hash_, fragment = url.partition("#")
    path, question, query = head.partition("?")
    if question:
        head = path + question + _redacted_parameters(query)
    return head + hash_ + (_redacted_parameters(fragment) if hash_ else "")


def format_bytes(n: int) -> str:
    """``16777216`` → ``"16 MiB"``; ``1536`` → ``"1.5 KiB"``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if value.is_integer() else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1024**3, "gb": 1000**3, "gib": 1024**3}


def parse_byte_size(text: str) -> int:
    """``"16MiB"`` / ``"500k"`` / ``"1048576"`` → bytes; raises ``ValueError``.

    ``k``/``m``/``g`` and ``KiB``/``MiB``/``GiB`` are powers of 1024, ``kB``/``MB``/``GB`` of 1000.
    """
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"bad size {text!r}; expected bytes, e.g. 16MiB, 500KiB or 1048576")
    value = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if value < 1:
        raise ValueError(f"size must be at least 1 byte, got {text!r}")
    return value


class _Deadline(SocketDeadline):
    """:class:`~specobs._deadline.SocketDeadline` fed from httpx: the sockets of a request's
    httpcore streams, new or reused connections alike."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds, name="specobs-http-deadline")

    def watch(self, stream: Any) -> None:
        """Remember the socket of an httpcore network stream (a new or a reused connection)."""
        try:
            sock = stream.get_extra_info("socket")
        except Exception:  # a transport without sockets (tests' MockTransport)
            return
        self.watch_socket(sock)

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        # httpx's "trace" extension: called for every connection step of the request.
        if event.endswith(("connect_tcp.complete", "start_tls.complete")):
            stream = info.get("return_value")
            if stream is not None:
                self.watch(stream)


class _Inflater:
    """Content-Encoding decoding with a bound on what one chunk may inflate to."""

    def __init__(self, encoding: str, url: str) -> None:
        enc = encoding.strip().lower()
        self._z: Any = None
        if enc in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif enc == "deflate":
            self._z = zlib.decompressobj()
        elif enc not in ("", "identity"):
            raise ScrapeError(
                f"{url} sent Content-Encoding {encoding!r}; expected gzip, deflate or none"
            )
        self.url = url

    def feed(self, data: bytes, room: int) -> bytes:
        """Up to ``room + 1`` decoded bytes of ``data`` (one more than fits means: over the cap)."""
        if self._z is None:
            return data[: room + 1]
        try:
            # With an output limit, zlib stops early and keeps the rest in unconsumed_tail: a
            # bomb never inflates past what fits.
            return bytes(self._z.decompress(data, room + 1))
        except zlib.error as exc:
            raise ScrapeError(f"{self.url} sent a body that does not decompress ({exc})") from None

    def flush(self) -> bytes:
        """What the decoder still holds once the input ended: little, because :meth:`feed`
        consumed every chunk whole (or the body was over the cap)."""
        if self._z is None:
            return b""
        try:
            return bytes(self._z.flush())
        except zlib.error as exc:
            raise ScrapeError(f"{self.url} sent a body that does not decompress ({exc})") from None


# -- the command line ------------------------------------------------------------------------


def add_source_arguments(parser: argparse.ArgumentParser, *, prometheus_help: str) -> None:
    """The positional ``url`` of a specobs endpoint and ``--prometheus``, the other source of
    the same series (``specobs doctor`` and ``specobs top``)."""
    parser.add_argument("url", nargs="?", default=None,
                        help="a specobs /metrics URL, e.g. http://127.0.0.1:9477/metrics "
                             "(host:port means http://host:port/metrics)")
    parser.add_argument("--prometheus", metavar="URL", default=None, help=prometheus_help)


def add_limit_arguments(parser: argparse.ArgumentParser, *, files: bool = False) -> None:
    """``--timeout`` and ``--max-bytes``, shared with ``specobs top``. ``files``: the command
    also reads snapshot files, which ``--max-bytes`` bounds as well (see :func:`file_limit`)."""
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS,
                        metavar="SECONDS",
                        help="deadline of each HTTP request: connecting, headers and the whole "
                             f"body (default: {DEFAULT_TIMEOUT_SECONDS:g})")
    what = (f"largest response body read, after decompression, e.g. 64MiB (default: "
            f"{format_bytes(DEFAULT_MAX_BYTES)})")
    if files:
        what += (f"; for a snapshot file, the whole file after decompression (default: "
                 f"{format_bytes(DEFAULT_MAX_FILE_BYTES)})")
    parser.add_argument("--max-bytes", type=_byte_size, default=None if files else
                        DEFAULT_MAX_BYTES, metavar="SIZE", help=what)


def _byte_size(text: str) -> int:
    try:
        return parse_byte_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def limits_from(args: argparse.Namespace) -> Limits:
    max_bytes = DEFAULT_MAX_BYTES if args.max_bytes is None else args.max_bytes
    return Limits(timeout_seconds=args.timeout, max_bytes=max_bytes)


def file_limit(args: argparse.Namespace) -> int:
    """What ``--max-bytes`` allows a snapshot file (after decompression)."""
    return DEFAULT_MAX_FILE_BYTES if args.max_bytes is None else int(args.max_bytes)


def http_client(args: argparse.Namespace) -> Any:
    """The tools' httpx client. No keep-alive: every request opens its own connection, whose
    socket the deadline can cut (see :mod:`specobs.tools._client`)."""
    import httpx

    return httpx.Client(
        timeout=args.timeout, follow_redirects=False,
        limits=httpx.Limits(max_keepalive_connections=0),
    )


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    # httpx wraps the OS error: "[Errno 111] Connection refused" → "connection refused".
    m = re.search(r"\[Errno -?\d+\]\s*(.*)", text)
    if m:
        text = m.group(1)
    return (text or type(exc).__name__)[:120]


def get(
    client: Any,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    params: Mapping[str, str] | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Fetched:
    """GET ``url`` with ``client`` (an ``httpx.Client``) within ``limits.timeout_seconds`` in
    total, reading at most ``limits.max_bytes`` of decoded body; raises :class:`ScrapeError`.

    Redirects are followed (at most :data:`MAX_REDIRECTS`). A non-2xx answer is returned with
    only the first few KiB of its body. Credentials in ``url`` are sent as HTTP Basic
    authentication and never appear in an error message (see :func:`display_url`).
    """
    import httpx

    timeout_seconds, max_bytes = limits.timeout_seconds, limits.max_bytes
    shown = display_url(url)
    sent = dict(headers or {})
    # Only encodings inflated here with a bound (httpx would add br/zstd when installed).
    sent["Accept-Encoding"] = "gzip"
    with _Deadline(timeout_seconds) as deadline:
        too_late = (
            f"{shown} did not finish answering within {timeout_seconds:g} s (the deadline of one "
            "request; raise it with --timeout)"
        )
        try:
            request = client.build_request(
                "GET", url, headers=sent, params=params, extensions={"trace": deadline.trace}
            )
            for _ in range(MAX_REDIRECTS + 1):
                if deadline.passed():
                    raise ScrapeError(too_late)
                response = client.send(request, stream=True, follow_redirects=False)
                try:
                    stream = response.extensions.get("network_stream")
                    if stream is not None:
                        deadline.watch(stream)
                    if response.next_request is not None:
                        request = response.next_request
                        continue
                    ok = 200 <= response.status_code < 300
                    body = _read_body(response, shown, max_bytes if ok else _ERROR_BODY_BYTES,
                                      deadline, too_late, truncate=not ok)
                    return Fetched(
                        response.status_code, response.reason_phrase, response.headers, body,
                        display_url(str(response.url)),
                    )
                finally:
                    response.close()
            raise ScrapeError(f"{shown} redirected more than {MAX_REDIRECTS} times")
        except ScrapeError:
            raise
        except httpx.TimeoutException:
            if deadline.passed():
                raise ScrapeError(too_late) from None
            raise ScrapeError(f"{shown} did not answer within {timeout_seconds:g} s") from None
        except httpx.ConnectError as exc:
            raise ScrapeError(f"cannot connect to {shown}: {scrub(_reason(exc), url)}") from None
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
            if deadline.passed():
                raise ScrapeError(too_late) from None
            raise ScrapeError(f"request to {shown} failed: {scrub(_reason(exc), url)}") from None


def _read_body(
    response: Any, url: str, limit: int, deadline: _Deadline, too_late: str, *, truncate: bool
) -> bytes:
    over = (
        f"{url} sent a body larger than {format_bytes(limit)} (after decompression): not a "
        "metrics endpoint? (--max-bytes raises the limit)"
    )
    encoding = response.headers.get("content-encoding", "").strip().lower()
    inflater = _Inflater(encoding, url)
    declared = response.headers.get("content-length", "")
    if not truncate and encoding in ("", "identity") and declared.isdigit() \
            and int(declared) > limit:
        raise ScrapeError(
            f"{url} announced a body of {format_bytes(int(declared))}, larger than "
            f"{format_bytes(limit)}: not a metrics endpoint? (--max-bytes raises the limit)"
        )
    body = bytearray()
    for raw in response.iter_raw(_CHUNK_BYTES):
        if deadline.passed():
            raise ScrapeError(too_late)
        room = limit - len(body)
        piece = inflater.feed(raw, room)
        if len(piece) > room:
            if truncate:
                return bytes(body + piece[:room])
            raise ScrapeError(over)
        body += piece
    if deadline.passed():
        raise ScrapeError(too_late)
    body += inflater.flush()
    if len(body) > limit:
        if truncate:
            return bytes(body[:limit])
        raise ScrapeError(over)
    return bytes(body)
