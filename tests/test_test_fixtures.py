"""Self-tests: the real-server fixtures really work.

- ``prometheus_server`` runs Debian's prometheus, which scrapes a real ``prometheus_client``
  endpoint, evaluates a rule file and answers PromQL; ``promtool`` checks that rule file.
- ``otlp_receiver`` receives what the official OTLP exporters (gRPC and HTTP/protobuf) send, and
  its fault knobs make those exporters report FAILURE.
"""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, Counter, start_http_server

from tests._otlp_receiver import OtlpReceiver
from tests._prometheus_server import PrometheusError, PrometheusServer, promtool

pytestmark = pytest.mark.slow

_EXPORT_TIMEOUT_SECONDS = 2.0
_RESOURCE = Resource.create({"service.name": "specobs-selftest", "specobs.test.run": "fixtures"})


# -- Prometheus -------------------------------------------------------------------------------


@pytest.fixture
def scrape_target() -> Iterator[str]:
    """A real prometheus_client endpoint (private registry) exposing a counter at 42."""
    registry = CollectorRegistry()
    counter = Counter(
        "specobs_selftest_requests", "Requests seen by the fixture self-test.", registry=registry
    )
    counter.inc(42)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


_RULES = """\
groups:
  - name: specobs-selftest
    rules:
      - record: job:specobs_selftest_requests:sum
        expr: sum by (job) (specobs_selftest_requests_total)
      - alert: SpecobsSelftestRequestsSeen
        expr: specobs_selftest_requests_total > 0
        labels:
          severity: info
        annotations:
          summary: The self-test counter is positive.
"""


def test_prometheus_scrapes_real_endpoint_and_evaluates_rules(
    prometheus_server: Callable[..., PrometheusServer], scrape_target: str, tmp_path: Path
) -> None:
    rules_path = tmp_path / "rules.yml"
    rules_path.write_text(_RULES)
    checked = promtool("check", "rules", rules_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    prom = prometheus_server([scrape_target], rule_files=[rules_path])

    [target] = prom.wait_for_target_up(timeout_seconds=15)
    assert target["labels"]["job"] == "specobs"
    [sample] = prom.wait_for("specobs_selftest_requests_total", timeout_seconds=15)
    assert sample["metric"]["instance"] == scrape_target
    assert float(sample["value"][1]) == 42.0

    [recorded] = prom.wait_for("job:specobs_selftest_requests:sum", timeout_seconds=15)
    assert float(recorded["value"][1]) == 42.0
    assert prom.wait_for(
        'ALERTS{alertname="SpecobsSelftestRequestsSeen",alertstate="firing"}',
        timeout_seconds=15,
    )
    assert [a["labels"]["alertname"] for a in prom.alerts()] == ["SpecobsSelftestRequestsSeen"]
    assert {g["name"] for g in prom.rules()} == {"specobs-selftest"}

    with pytest.raises(PrometheusError, match="bad_data"):
        prom.query("sum(")


def test_promtool_reports_bad_exposition() -> None:
    bad = promtool("check", "metrics", input="# TYPE x counter\nx{ 1\n")
    assert bad.returncode != 0
    assert bad.stdout + bad.stderr


# -- OTLP -------------------------------------------------------------------------------------


def _make_spans() -> list[ReadableSpan]:
    finished = InMemorySpanExporter()
    provider = TracerProvider(resource=_RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(finished))
    tracer = provider.get_tracer("specobs.selftest", "0.0.1")
    with tracer.start_as_current_span("specobs.step", attributes={"specobs.accepted": 3}):
        with tracer.start_as_current_span("specobs.verify"):
            pass
    provider.shutdown()
    return list(finished.get_finished_spans())


def _make_metrics() -> MetricsData:
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=_RESOURCE, metric_readers=[reader])
    meter = provider.get_meter("specobs.selftest")
    meter.create_counter("specobs.selftest.tokens").add(7, {"kind": "accepted"})
    data = reader.get_metrics_data()
    provider.shutdown()
    assert data is not None
    return data


def _grpc_exporters(
    receiver: OtlpReceiver, timeout: float = _EXPORT_TIMEOUT_SECONDS
) -> tuple[GrpcSpanExporter, GrpcMetricExporter]:
    return (
        GrpcSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True, timeout=timeout),
        GrpcMetricExporter(endpoint=receiver.grpc_endpoint, insecure=True, timeout=timeout),
    )


def _http_exporters(
    receiver: OtlpReceiver, timeout: float = _EXPORT_TIMEOUT_SECONDS
) -> tuple[HttpSpanExporter, HttpMetricExporter]:
    # An explicit endpoint is used verbatim: only the OTEL_EXPORTER_OTLP_ENDPOINT env var gets
    # the signal path appended by the exporter.
    return (
        HttpSpanExporter(
            endpoint=f"{receiver.http_endpoint}/v1/traces",
            timeout=timeout,
            compression=Compression.Gzip,
        ),
        HttpMetricExporter(endpoint=f"{receiver.http_endpoint}/v1/metrics", timeout=timeout),
    )


def _export_once(
    span_exporter: SpanExporter, metric_exporter: MetricExporter
) -> tuple[SpanExportResult, MetricExportResult]:
    """One export of the test spans and one of the test metrics; both exporters shut down."""
    try:
        return span_exporter.export(_make_spans()), metric_exporter.export(_make_metrics())
    finally:
        span_exporter.shutdown()
        metric_exporter.shutdown()


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_otlp_receiver_gets_spans_and_metrics(otlp_receiver: OtlpReceiver, transport: str) -> None:
    make = _grpc_exporters if transport == "grpc" else _http_exporters
    assert _export_once(*make(otlp_receiver)) == (
        SpanExportResult.SUCCESS, MetricExportResult.SUCCESS
    )  # fmt: skip

    spans = {s.name: s for s in otlp_receiver.spans()}
    assert set(spans) == {"specobs.step", "specobs.verify"}
    step, verify = spans["specobs.step"], spans["specobs.verify"]
    assert verify.parent_span_id == step.span_id
    assert verify.trace_id == step.trace_id and len(step.trace_id) == 32
    assert step.attributes == {"specobs.accepted": 3}
    assert step.resource["service.name"] == "specobs-selftest"
    assert step.resource["specobs.test.run"] == "fixtures"
    assert step.scope_name == "specobs.selftest" and step.scope_version == "0.0.1"
    assert {s.transport for s in spans.values()} == {transport}

    assert otlp_receiver.metric_names() == {"specobs.selftest.tokens"}
    [(resource, metric)] = otlp_receiver.metrics()
    assert resource["service.name"] == "specobs-selftest"
    [point] = metric.sum.data_points
    assert point.as_int == 7
    assert {r.transport for r in otlp_receiver.requests()} == {transport}
    if transport == "http":  # the span exporter was built with gzip compression
        [traces_request] = otlp_receiver.requests(signal="traces")
        assert traces_request.headers["content-encoding"] == "gzip"

    otlp_receiver.clear()
    assert otlp_receiver.requests() == [] and otlp_receiver.spans() == []


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_exporter_reports_failure_when_receiver_fails(
    otlp_receiver: OtlpReceiver, transport: str
) -> None:
    otlp_receiver.fail_with_status = grpc.StatusCode.UNAVAILABLE
    make = _grpc_exporters if transport == "grpc" else _http_exporters
    # UNAVAILABLE / 503 is retryable, but the first backoff (>= 0.8 s, jittered) exceeds a 0.5 s
    # deadline, so the exporter gives up after one attempt instead of sleeping.
    assert _export_once(*make(otlp_receiver, 0.5)) == (
        SpanExportResult.FAILURE, MetricExportResult.FAILURE
    )  # fmt: skip
    assert otlp_receiver.rejected_count >= 2
    assert otlp_receiver.requests() == []


def test_slow_receiver_makes_exporter_time_out(otlp_receiver: OtlpReceiver) -> None:
    otlp_receiver.delay_seconds = 30.0
    exporter = GrpcSpanExporter(endpoint=otlp_receiver.grpc_endpoint, insecure=True, timeout=0.3)
    try:
        assert exporter.export(_make_spans()) == SpanExportResult.FAILURE
    finally:
        exporter.shutdown()
    # stop() (fixture teardown) releases the handler still waiting out its delay.


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=_EXPORT_TIMEOUT_SECONDS) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def test_http_receiver_decodes_gzip_and_rejects_wrong_content_type(
    otlp_receiver: OtlpReceiver,
) -> None:
    body = trace_service_pb2.ExportTraceServiceRequest().SerializeToString()
    status, reply = _post(
        f"{otlp_receiver.http_endpoint}/v1/traces",
        gzip.compress(body),
        {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
    )
    assert status == 200
    trace_service_pb2.ExportTraceServiceResponse.FromString(reply)
    assert otlp_receiver.wait_for(lambda: len(otlp_receiver.requests()) == 1, 1.0)

    status, _ = _post(
        f"{otlp_receiver.http_endpoint}/v1/traces", b"{}", {"Content-Type": "application/json"}
    )
    assert status == 415
    status, _ = _post(
        f"{otlp_receiver.http_endpoint}/v1/logs", body, {"Content-Type": "application/x-protobuf"}
    )
    assert status == 404
    assert len(otlp_receiver.requests()) == 1
