"""A real OTLP receiver for tests, built from the official ``opentelemetry-proto`` package.

No OpenTelemetry Collector binary can be installed here, so the suite runs this receiver instead.
It speaks both OTLP transports the official exporters use:

- gRPC: a ``grpcio`` server implementing ``TraceService.Export`` and ``MetricsService.Export``
  (the generated ``*_pb2_grpc`` servicers), at :attr:`OtlpReceiver.grpc_endpoint`.
- HTTP/protobuf: a stdlib ``ThreadingHTTPServer`` answering ``POST /v1/traces`` and
  ``POST /v1/metrics`` with ``Content-Type: application/x-protobuf`` (bodies may be
  ``Content-Encoding: gzip`` or ``deflate``), at :attr:`OtlpReceiver.http_endpoint` — a base URL,
  the exporter appends ``/v1/traces``.

Every accepted request is stored, thread-safely, as a :class:`ReceivedRequest` that records the
transport it came by. Helpers flatten what arrived:

- :meth:`OtlpReceiver.spans` returns :class:`ReceivedSpan` objects: flat fields (name, ids as hex,
  attributes as a dict, ...) plus the resource attributes as a dict, the instrumentation scope,
  the transport and the raw protobuf ``Span``.
- :meth:`OtlpReceiver.metrics` returns ``(resource_attrs, Metric)`` pairs, ``Metric`` being the
  protobuf message.

Fault knobs, settable at any time: ``fail_with_status`` (a ``grpc.StatusCode``; gRPC aborts with
it, HTTP answers the matching status, ``UNAVAILABLE`` -> 503) and ``delay_seconds`` (a slow
collector: each export waits that long before it answers).

The pytest fixture :func:`otlp_receiver` yields a started receiver and stops it afterwards; load
this module as a plugin (``-p tests._otlp_receiver``) to use it.
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import grpc
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

__all__ = [
    "OtlpReceiver",
    "ReceivedRequest",
    "ReceivedSpan",
    "any_value_to_python",
    "attributes_to_dict",
    "otlp_receiver",
]

Transport = Literal["grpc", "http"]
Signal = Literal["traces", "metrics"]
ExportRequest = (
    trace_service_pb2.ExportTraceServiceRequest | metrics_service_pb2.ExportMetricsServiceRequest
)

_PROTOBUF_CONTENT_TYPE = "application/x-protobuf"

# HTTP status an OTLP/HTTP server answers for each gRPC code a test may ask for; the mapping
# follows the OTLP spec (retryable: 429, 502, 503, 504).
_HTTP_STATUS_FOR_GRPC_CODE: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.ABORTED: 502,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
}


def any_value_to_python(value: common_pb2.AnyValue) -> Any:
    """Convert an OTLP ``AnyValue`` to the matching Python value (``None`` when unset)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value_to_python(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_to_dict(value.kvlist_value.values)
    return getattr(value, kind)


def attributes_to_dict(attributes: Any) -> dict[str, Any]:
    """Convert a repeated ``KeyValue`` field (attributes) to a plain dict."""
    return {kv.key: any_value_to_python(kv.value) for kv in attributes}


@dataclass(frozen=True)
class ReceivedRequest:
    """One accepted export request, exactly as it was decoded."""

    transport: Transport
    signal: Signal
    request: ExportRequest
    headers: dict[str, str]
    """Lower-cased HTTP headers or gRPC invocation metadata."""
    received_at_ns: int
    """``time.time_ns()`` when the request was accepted."""


@dataclass(frozen=True)
class ReceivedSpan:
    """A span flattened with its resource and scope; ``span`` is the protobuf ``Span``."""

    name: str
    trace_id: str
    """Lower-case hex, 32 characters."""
    span_id: str
    """Lower-case hex, 16 characters."""
    parent_span_id: str
    """Lower-case hex, or ``""`` for a root span."""
    kind: int
    """A ``trace_pb2.Span.SpanKind`` value."""
    start_time_unix_nano: int
    end_time_unix_nano: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    """``(name, attributes)`` per span event."""
    status_code: int
    """A ``trace_pb2.Status.StatusCode`` value."""
    status_message: str
    resource: dict[str, Any]
    scope_name: str
    scope_version: str
    transport: Transport
    span: trace_pb2.Span = field(repr=False)


class _ReceivingServicer:
    """An OTLP gRPC service whose Export hands each request to the receiver as ``signal`` and
    answers an empty ``response``."""

    signal: Signal
    response: type[Any]

    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._receiver._handle_grpc(self.signal, request, context)
        return self.response()


class _TraceServicer(_ReceivingServicer, trace_service_pb2_grpc.TraceServiceServicer):
    signal = "traces"
    response = trace_service_pb2.ExportTraceServiceResponse


class _MetricsServicer(_ReceivingServicer, metrics_service_pb2_grpc.MetricsServiceServicer):
    signal = "metrics"
    response = metrics_service_pb2.ExportMetricsServiceResponse


_HTTP_ROUTES: dict[str, tuple[Signal, type[Any], type[Any]]] = {
    "/v1/traces": (
        "traces",
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
    ),
    "/v1/metrics": (
        "metrics",
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
}


class _OtlpHttpHandler(BaseHTTPRequestHandler):
    server: _OtlpHttpServer
    protocol_version = "HTTP/1.1"  # keep-alive, as the exporters' sessions expect

    def log_message(self, format: str, *args: Any) -> None:
        # Silence per-request stderr logging; tests inspect the stored requests instead.
        pass

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        route = _HTTP_ROUTES.get(path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if route is None:
            self._reply_status(HTTPStatus.NOT_FOUND, f"no OTLP route {path!r}")
            return
        signal, request_type, response_type = route
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip()
        if content_type != _PROTOBUF_CONTENT_TYPE:
            self._reply_status(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                f"expected Content-Type {_PROTOBUF_CONTENT_TYPE}, got {content_type!r}",
            )
            return
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            elif encoding != "identity":
                self._reply_status(
                    HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"unsupported Content-Encoding {encoding!r}"
                )
                return
            request = request_type.FromString(body)
        except Exception as exc:  # a malformed body is the client's fault: answer 400
            self._reply_status(HTTPStatus.BAD_REQUEST, f"cannot decode request: {exc}")
            return

        receiver = self.server.receiver
        receiver._pause()
        code = receiver.fail_with_status
        if code is not None:
            self._reply_status(
                HTTPStatus(_HTTP_STATUS_FOR_GRPC_CODE.get(code, 500)),
                f"OtlpReceiver.fail_with_status={code.name}",
                grpc_code=code.value[0],
            )
            receiver._count_rejected()
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        receiver._store("http", signal, request, headers)
        self._reply(HTTPStatus.OK, response_type().SerializeToString())

    def _reply_status(self, status: HTTPStatus, message: str, grpc_code: int = 3) -> None:
        # OTLP/HTTP error bodies are a serialized google.rpc.Status.
        body = status_pb2.Status(code=grpc_code, message=message).SerializeToString()
        self._reply(status, body)

    def _reply(self, status: HTTPStatus, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", _PROTOBUF_CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _OtlpHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, receiver: OtlpReceiver) -> None:
        super().__init__(("127.0.0.1", 0), _OtlpHttpHandler)
        self.receiver = receiver


class OtlpReceiver:
    """A real OTLP/gRPC + OTLP/HTTP receiver on free loopback ports; see the module docstring.

    ``start()`` binds both servers; ``stop()`` shuts them down (idempotent). Usable as a context
    manager. ``fail_with_status`` and ``delay_seconds`` may be changed while it runs.
    """

    def __init__(
        self,
        *,
        fail_with_status: grpc.StatusCode | None = None,
        delay_seconds: float = 0.0,
    ) -> None:
        self.fail_with_status = fail_with_status
        self.delay_seconds = delay_seconds
        self.grpc_endpoint = ""
        self.http_endpoint = ""
        self._lock = threading.Lock()
        self._requests: list[ReceivedRequest] = []
        self._rejected = 0
        self._stopping = threading.Event()
        self._grpc_server: grpc.Server | None = None
        self._http_server: _OtlpHttpServer | None = None
        self._http_thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> OtlpReceiver:
        if self._grpc_server is not None:
            raise RuntimeError("OtlpReceiver.start() called twice; create a new receiver.")
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="otlp-receiver-grpc")
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _TraceServicer(self), server
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _MetricsServicer(self), server
        )
        grpc_port = server.add_insecure_port("127.0.0.1:0")
        if grpc_port == 0:
            raise RuntimeError("OtlpReceiver could not bind a gRPC port on 127.0.0.1.")
        server.start()
        self._grpc_server = server
        self.grpc_endpoint = f"http://127.0.0.1:{grpc_port}"

        self._http_server = _OtlpHttpServer(self)
        self.http_endpoint = f"http://127.0.0.1:{self._http_server.server_address[1]}"
        self._http_thread = threading.Thread(
            target=self._http_server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="otlp-receiver-http",
            daemon=True,
        )
        self._http_thread.start()
        return self

    def stop(self) -> None:
        """Stop both servers; waiting exports are released at once (idempotent)."""
        self._stopping.set()
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=None).wait(5)
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
            self._http_server = None
        if self._http_thread is not None:
            self._http_thread.join(5)
            self._http_thread = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- storage -----------------------------------------------------------------------------

    def requests(
        self, *, transport: Transport | None = None, signal: Signal | None = None
    ) -> list[ReceivedRequest]:
        """Accepted requests in arrival order, optionally filtered."""
        with self._lock:
            found = list(self._requests)
        return [
            r
            for r in found
            if (transport is None or r.transport == transport)
            and (signal is None or r.signal == signal)
        ]

    @property
    def rejected_count(self) -> int:
        """How many exports were refused because of ``fail_with_status``."""
        with self._lock:
            return self._rejected

    def spans(self, *, transport: Transport | None = None) -> list[ReceivedSpan]:
        """Every received span, flattened (see :class:`ReceivedSpan`), in arrival order."""
        out: list[ReceivedSpan] = []
        for received in self.requests(transport=transport, signal="traces"):
            for resource_spans in received.request.resource_spans:
                resource = attributes_to_dict(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        out.append(
                            ReceivedSpan(
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                kind=span.kind,
                                start_time_unix_nano=span.start_time_unix_nano,
                                end_time_unix_nano=span.end_time_unix_nano,
                                attributes=attributes_to_dict(span.attributes),
                                events=[
                                    (e.name, attributes_to_dict(e.attributes)) for e in span.events
                                ],
                                status_code=span.status.code,
                                status_message=span.status.message,
                                resource=resource,
                                scope_name=scope_spans.scope.name,
                                scope_version=scope_spans.scope.version,
                                transport=received.transport,
                                span=span,
                            )
                        )
        return out

    def metrics(
        self, *, transport: Transport | None = None
    ) -> list[tuple[dict[str, Any], metrics_pb2.Metric]]:
        """Every received metric as ``(resource_attrs, Metric protobuf)``, in arrival order."""
        out: list[tuple[dict[str, Any], metrics_pb2.Metric]] = []
        for received in self.requests(transport=transport, signal="metrics"):
            for resource_metrics in received.request.resource_metrics:
                resource = attributes_to_dict(resource_metrics.resource.attributes)
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        out.append((resource, metric))
        return out

    def metric_names(self, *, transport: Transport | None = None) -> set[str]:
        """Names of every metric received so far."""
        return {metric.name for _, metric in self.metrics(transport=transport)}

    def wait_for(
        self,
        predicate: Callable[[], bool],
        timeout_seconds: float = 5.0,
        poll_interval_seconds: float = 0.02,
    ) -> bool:
        """Poll ``predicate()`` until it is true (-> True) or the deadline passes (-> False)."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_interval_seconds)

    def clear(self) -> None:
        """Forget every stored request and the rejected count."""
        with self._lock:
            self._requests.clear()
            self._rejected = 0

    # -- called from server threads ----------------------------------------------------------

    def _pause(self) -> None:
        # Event.wait rather than sleep so that stop() releases a slow export immediately.
        if self.delay_seconds > 0:
            self._stopping.wait(self.delay_seconds)

    def _store(
        self, transport: Transport, signal: Signal, request: ExportRequest, headers: dict[str, str]
    ) -> None:
        received = ReceivedRequest(transport, signal, request, headers, time.time_ns())
        with self._lock:
            self._requests.append(received)

    def _count_rejected(self) -> None:
        with self._lock:
            self._rejected += 1

    def _handle_grpc(
        self, signal: Signal, request: ExportRequest, context: grpc.ServicerContext
    ) -> None:
        self._pause()
        code = self.fail_with_status
        if code is not None:
            self._count_rejected()
            context.abort(code, f"OtlpReceiver.fail_with_status={code.name}")
        headers = {k.lower(): str(v) for k, v in context.invocation_metadata()}
        self._store("grpc", signal, request, headers)


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A started :class:`OtlpReceiver`, stopped after the test."""
    receiver = OtlpReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()
