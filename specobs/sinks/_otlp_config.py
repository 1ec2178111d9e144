"""OTLP transport settings: the ``OTEL_EXPORTER_OTLP_*`` protocol variables and the exporters.

The endpoint, header, timeout, TLS and compression variables are interpreted by the official
exporters themselves, so they mean here what they mean to every other Python OpenTelemetry
program. specobs resolves only what those exporters do not: which protocol each signal uses,
credentials written into the endpoint URL, and how much of a collector's answer the worker may
have to wait for and hold.

Credentials in the endpoint (``http://user:password@host:port``)
    Neither exporter treats URL userinfo as credentials: the gRPC exporter makes
    ``user:password@host:port`` its channel target (and prints it in its log lines), the
    HTTP exporter leaves it to ``requests``. specobs takes the userinfo out of the URL handed to
    either exporter and sends it as an HTTP Basic ``authorization`` header (gRPC metadata), the
    way ``requests`` and curl treat such URLs; :func:`redact_url` is what any message or
    ``repr`` shows. An ``authorization`` header given as well is a
    :class:`~specobs.ConfigurationError` (two credentials, and no way to tell which one the user
    meant).

Bounded OTLP/HTTP responses
    The HTTP exporter's ``requests`` transport reads a whole response body into memory, and its
    timeout bounds one socket read, so a collector (or a proxy) answering with an endless body,
    or one byte every few seconds, costs the worker memory or holds an export for as long as it
    likes. Each http/protobuf exporter is given a ``requests.Session`` (its public ``session=``
    argument) whose adapter bounds every request: a deadline covering connect, headers and
    body (the exporter passes what is left of its own timeout, so the whole export, retries
    included, ends within its timeout), enforced by a timer that shuts the request's socket down,
    and at most :data:`MAX_RESPONSE_BYTES` of decoded body. Either overrun fails the request
    with a one-line reason, which the exporter logs and reports as a failed export; it is not
    retried (the time is spent, and a collector that sends megabytes will send them again).
    A redirect (3xx) fails the request the same way: the exporters count any status below 400
    as a success and follow no redirect, so an ``http://`` endpoint moved to ``https://`` lost
    every export with nothing counted.
"""

from __future__ import annotations

import base64
import functools
import importlib
import io
import logging
import math
import os
import threading
from collections.abc import Mapping
from typing import Any, Literal, cast
from urllib.parse import unquote

from specobs._deadline import SocketDeadline
from specobs._errors import ConfigurationError, require

require("opentelemetry.sdk", feature="OTLP export", extra="otlp")

from opentelemetry.sdk.metrics.export import MetricExporter  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter  # noqa: E402

__all__ = [
    "MAX_RESPONSE_BYTES",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "PROTOCOLS",
    "CollectorResponseError",
    "OtlpProtocol",
    "bounded_session",
    "check_sink_arguments",
    "make_metric_exporter",
    "make_span_exporter",
    "positive_seconds",
    "redact_url",
    "resolve_protocol",
    "split_userinfo",
]

OtlpProtocol = Literal["grpc", "http/protobuf"]
PROTOCOLS: tuple[str, ...] = ("grpc", "http/protobuf")

OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
"""OTLP transport for both signals: ``grpc`` (default, as the Python SDK) or ``http/protobuf``."""

OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
"""OTLP transport for spans; overrides ``OTEL_EXPORTER_OTLP_PROTOCOL``."""

OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
"""OTLP transport for metrics; overrides ``OTEL_EXPORTER_OTLP_PROTOCOL``."""

#: Largest OTLP/HTTP response body read, after decompression. An OTLP answer is an empty
#: ``Export*ServiceResponse`` or a short ``partial_success`` / ``google.rpc.Status`` message, a
#: proxy's error page a few KiB; anything past this fails the export.
MAX_RESPONSE_BYTES = 1024 * 1024

_log = logging.getLogger("specobs")
_CHUNK_BYTES = 16 * 1024


def _protocol(name: str, value: str) -> OtlpProtocol:
    v = value.strip().lower()
    if v not in PROTOCOLS:
        raise ConfigurationError(
            f"{name} must be 'grpc' or 'http/protobuf', got {value!r}. "
            f"(OTLP over http/json is not supported.)"
        )
    return cast(OtlpProtocol, v)


def resolve_protocol(arg: str | None, signal_var: str, env: Mapping[str, str]) -> OtlpProtocol:
    """The argument, else the signal's variable, else the general one, else ``grpc``."""
    if arg is not None:
        return _protocol("protocol", arg)
    for var in (signal_var, OTEL_EXPORTER_OTLP_PROTOCOL):
        raw = env.get(var)
        if raw is not None and raw.strip():
            return _protocol(var, raw)
    return "grpc"


def positive_seconds(name: str, value: object) -> float:
    """A finite number of seconds > 0, else a ConfigurationError naming ``name``."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigurationError(f"{name} must be a number of seconds > 0, got {value!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise ConfigurationError(f"{name} must be a number of seconds > 0, got {value!r}")
    return v


def check_sink_arguments(
    traces: bool, metrics: bool, max_queue_size: int, endpoint: str | None
) -> None:
    """Refuse an ``OtlpSink`` that would export nothing, or an unusable queue bound or endpoint."""
    if not traces and not metrics:
        raise ConfigurationError(
            "OtlpSink(traces=False, metrics=False) would export nothing; "
            "enable at least one signal or drop the sink."
        )
    if (
        isinstance(max_queue_size, bool)
        or not isinstance(max_queue_size, int)
        or (max_queue_size < 1)
    ):
        raise ConfigurationError(
            f"max_queue_size must be an integer >= 1, got {max_queue_size!r}"
        )
    if endpoint is not None and (not isinstance(endpoint, str) or not endpoint.strip()):
        raise ConfigurationError(
            f"endpoint must be a URL such as 'http://localhost:4317', got {endpoint!r}"
        )


def _after_scheme(url: str) -> tuple[str, str]:
    scheme, sep, rest = url.partition("://")
    return (scheme + sep, rest) if sep else ("", url)


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without its userinfo, and the HTTP Basic ``authorization`` value made of it.

    ``http://alice:p%40ss@host:4318/x`` → ``("http://host:4318/x", "Basic YWxpY2U6cEBzcw==")``;
    a URL without userinfo comes back unchanged, with None. Works on scheme-less gRPC targets
    (``alice:pw@host:4317``) too. User and password are percent-decoded, as ``requests`` does.
    """
    prefix, rest = _after_scheme(url)
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc = rest[:end]
    if "@" not in netloc:
        return url, None
    userinfo, _, hostport = netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    return prefix + hostport + rest[end:], f"Basic {token}"


def redact_url(url: str) -> str:
    """``url`` as it may be printed: without userinfo (see :func:`split_userinfo`)."""
    return split_userinfo(url)[0]


def _signal_endpoint(endpoint: str | None, protocol: OtlpProtocol, path: str) -> str | None:
    if endpoint is None:
        return None  # the exporter reads the per-signal and the general variable itself
    if protocol == "grpc":
        return endpoint
    return f"{endpoint.rstrip('/')}/{path}"


def _env_endpoint(signal: str, protocol: OtlpProtocol, env: Mapping[str, str]) -> str | None:
    """The endpoint the exporter would read from the variables itself (same precedence)."""
    per_signal = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
    if per_signal:
        return per_signal  # a full URL for http/protobuf, used as is
    general = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return _signal_endpoint(general, protocol, f"v1/{signal}") if general else None


def _env_headers(signal: str, env: Mapping[str, str]) -> dict[str, str]:
    from opentelemetry.util.re import parse_env_headers

    raw = (env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_HEADERS")
           or env.get("OTEL_EXPORTER_OTLP_HEADERS") or "")
    return dict(parse_env_headers(raw, liberal=True))


def _with_credentials(
    signal: str, protocol: OtlpProtocol, endpoint: str | None,
    headers: dict[str, str] | None, env: Mapping[str, str],
) -> tuple[str | None, dict[str, str] | None]:
    """The signal's URL and headers to hand to the exporter, userinfo moved into a header."""
    url = _signal_endpoint(endpoint, protocol, f"v1/{signal}")
    url_seen = url if url is not None else _env_endpoint(signal, protocol, env)
    if url_seen is None:
        return url, headers
    stripped, authorization = split_userinfo(url_seen)
    if authorization is None:
        return url, headers
    # A headers argument replaces the variables for the gRPC exporter (and wins over them for
    # HTTP), so the header set is resolved here once it has to be extended.
    merged = dict(headers) if headers is not None else _env_headers(signal, env)
    if any(k.lower() == "authorization" for k in merged):
        where = "endpoint" if endpoint is not None else "OTEL_EXPORTER_OTLP_*ENDPOINT variable"
        raise ConfigurationError(
            f"the OTLP {where} {redact_url(url_seen)!r} carries a user and password, and an "
            f"'authorization' header is set too; expected one set of credentials, got both. "
            f"Drop the userinfo from the URL or the header."
        )
    merged["authorization"] = authorization
    return stripped, merged


#: The official exporter class of each (signal, protocol), imported only when made.
_EXPORTERS: dict[tuple[str, str], tuple[str, str]] = {
    ("traces", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                         "OTLPSpanExporter"),
    ("traces", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                                  "OTLPSpanExporter"),
    ("metrics", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
                          "OTLPMetricExporter"),
    ("metrics", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.metric_exporter",
                                   "OTLPMetricExporter"),
}


def _make(signal: str, protocol: OtlpProtocol, endpoint: str | None,
          headers: dict[str, str] | None, timeout_seconds: float | None,
          env: Mapping[str, str]) -> object:
    module, name = _EXPORTERS[(signal, protocol)]
    url, headers = _with_credentials(signal, protocol, endpoint, headers, env)
    exporter_class = getattr(importlib.import_module(module), name)
    extra: dict[str, Any] = {}
    if protocol == "http/protobuf":
        extra["session"] = bounded_session(signal, env)
    return exporter_class(endpoint=url, headers=headers, timeout=timeout_seconds, **extra)


def make_span_exporter(
    protocol: OtlpProtocol, endpoint: str | None, headers: dict[str, str] | None,
    timeout_seconds: float | None, env: Mapping[str, str] = os.environ,
) -> SpanExporter:
    """The official OTLP span exporter for ``protocol``; ``endpoint`` is a base URL or None."""
    return cast(SpanExporter, _make("traces", protocol, endpoint, headers, timeout_seconds, env))


def make_metric_exporter(
    protocol: OtlpProtocol, endpoint: str | None, headers: dict[str, str] | None,
    timeout_seconds: float | None, env: Mapping[str, str] = os.environ,
) -> MetricExporter:
    """The official OTLP metric exporter for ``protocol``; ``endpoint`` is a base URL or None."""
    return cast(MetricExporter,
                _make("metrics", protocol, endpoint, headers, timeout_seconds, env))


# -- bounded OTLP/HTTP responses ---------------------------------------------------------------


class CollectorResponseError(Exception):
    """An OTLP/HTTP request overran its deadline or its response cap; ``str()`` says which.

    Not a ``requests`` connection error, so the exporter reports the export as failed at once
    instead of retrying it.
    """


# The deadline of the request the current thread is sending: requests and urllib3 run a request
# on the caller's thread, so the connection finds it here when it starts reading the response.
_current = threading.local()


def _watch_current(sock: object) -> None:
    deadline: SocketDeadline | None = getattr(_current, "deadline", None)
    if deadline is not None:
        deadline.watch_socket(sock)


def _seconds_of(timeout: object) -> float | None:
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return float(timeout)
    if isinstance(timeout, tuple):
        parts = [float(t) for t in timeout if isinstance(t, (int, float))]
        return sum(parts) if parts else None
    return None


@functools.cache
def _bounded_adapter_class() -> type[Any]:
    """The adapter class, built on first use: ``requests`` is imported only for http/protobuf."""
    import requests.adapters
    import urllib3
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class _WatchedHTTPConnection(HTTPConnection):
        def getresponse(self) -> Any:  # status line, headers and body come on this socket
            _watch_current(self.sock)
            return super().getresponse()

    class _WatchedHTTPSConnection(HTTPSConnection):
        def getresponse(self) -> Any:
            _watch_current(self.sock)
            return super().getresponse()

    class _WatchedHTTPPool(HTTPConnectionPool):
        ConnectionCls = _WatchedHTTPConnection

    class _WatchedHTTPSPool(HTTPSConnectionPool):
        ConnectionCls = _WatchedHTTPSConnection

    pools = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}

    class BoundedAdapter(requests.adapters.HTTPAdapter):
        """An ``HTTPAdapter`` whose requests end by their timeout and read a capped body."""

        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = pools

        def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
            manager = super().proxy_manager_for(proxy, **proxy_kwargs)
            if type(manager) is urllib3.ProxyManager:  # SOCKS managers keep their own pools
                manager.pool_classes_by_scheme = pools
            return manager

        def send(self, request: Any, stream: bool = False, timeout: Any = None,
                 verify: Any = True, cert: Any = None, proxies: Any = None) -> Any:
            seconds = _seconds_of(timeout)
            deadline = (
                SocketDeadline(seconds, name="specobs-otlp-deadline")
                if seconds is not None else None
            )
            _current.deadline = deadline
            try:
                response = super().send(request, stream=True, timeout=timeout, verify=verify,
                                        cert=cert, proxies=proxies)
                body = _read_capped(response, deadline)
            except CollectorResponseError:
                raise
            except Exception as exc:
                if deadline is not None and deadline.expired:
                    raise _late(deadline) from exc
                raise
            finally:
                _current.deadline = None
                if deadline is not None:
                    deadline.finish()
            if 300 <= response.status_code < 400:
                # The exporters count any status below 400 as success and follow no redirect:
                # the data would be lost with nothing counted.
                raise CollectorResponseError(_redirected(response))
            # What the session and the exporter read from now on: the bytes already taken.
            response.raw = io.BytesIO(body)
            return response

    return BoundedAdapter


def _redirected(response: Any) -> str:
    where = response.headers.get("location", "")
    to = f" to {redact_url(where)[:200]!r}" if where else ""
    return (
        f"the OTLP collector answered {response.status_code} (a redirect{to}); OTLP exporters "
        f"follow no redirects: set the endpoint to where it points; the export failed"
    )


def _late(deadline: SocketDeadline) -> CollectorResponseError:
    return CollectorResponseError(
        f"the OTLP collector did not complete its answer within the export's timeout "
        f"({deadline.seconds:.3g} s were left of it for this request); the export failed"
    )


def _read_capped(response: Any, deadline: SocketDeadline | None) -> bytes:
    """The decoded body, at most :data:`MAX_RESPONSE_BYTES`; the connection goes back to the
    pool when it was read to its end, and is closed otherwise."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
        response.close()
        raise CollectorResponseError(
            f"the OTLP collector announced a {int(declared)}-byte response; at most "
            f"{MAX_RESPONSE_BYTES} bytes are read (an OTLP answer is a few bytes); "
            f"the export failed"
        )
    chunks: list[bytes] = []
    size = 0
    try:
        # decode_content: urllib3 inflates gzip/deflate in bounded steps (no bomb).
        for chunk in response.raw.stream(_CHUNK_BYTES, decode_content=True):
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise CollectorResponseError(
                    f"the OTLP collector's response exceeded {MAX_RESPONSE_BYTES} bytes (an "
                    f"OTLP answer is a few bytes); the rest was not read and the export failed"
                )
            chunks.append(chunk)
            if deadline is not None and deadline.passed():
                raise _late(deadline)
    except BaseException:
        response.close()
        raise
    response.raw.release_conn()
    return b"".join(chunks)


_CREDENTIAL_PROVIDER_VARS = {
    "traces": "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
    "metrics": "OTEL_PYTHON_EXPORTER_OTLP_HTTP_METRICS_CREDENTIAL_PROVIDER",
}
_CREDENTIAL_PROVIDER_VAR = "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER"


def bounded_session(signal: str, env: Mapping[str, str] = os.environ) -> Any:
    """A ``requests.Session`` whose HTTP(S) requests are bounded (see the module docstring).

    When an ``OTEL_PYTHON_EXPORTER_OTLP_HTTP_*CREDENTIAL_PROVIDER`` variable names a session
    (an ``opentelemetry_otlp_credential_provider`` entry point, as the exporter would load it),
    that session is used, with the bounded adapter mounted where it had requests' default one.
    """
    import requests
    import requests.adapters

    adapter = _bounded_adapter_class()()
    provider = env.get(_CREDENTIAL_PROVIDER_VAR) or env.get(_CREDENTIAL_PROVIDER_VARS[signal])
    if not provider:
        session = requests.Session()
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session
    from importlib.metadata import entry_points

    found = list(entry_points(group="opentelemetry_otlp_credential_provider", name=provider))
    if not found:
        raise ConfigurationError(
            f"the OTLP credential provider {provider!r} (OTEL_PYTHON_EXPORTER_OTLP_HTTP_*"
            f"CREDENTIAL_PROVIDER) is not an installed 'opentelemetry_otlp_credential_provider' "
            f"entry point"
        )
    session = found[0].load()()
    if not isinstance(session, requests.Session):
        raise ConfigurationError(
            f"the OTLP credential provider {provider!r} must return a requests.Session, got "
            f"{type(session).__name__}"
        )
    for prefix in ("http://", "https://"):
        if type(session.get_adapter(prefix)) is requests.adapters.HTTPAdapter:
            session.mount(prefix, adapter)
        else:
            _log.info("specobs: the OTLP credential provider's session has its own adapter "
                      "for %s; its responses are not bounded by specobs", prefix)
    return session
