"""The OTLP sink against a real OTLP receiver (gRPC and HTTP/protobuf).

GPU durations come from a fake GPU the test drives (``gpu.run(ns)`` between marks), so every
span duration and histogram bucket can be compared exactly with the resolved cycles and with
``observer.snapshot()`` — the same aggregation the Prometheus sink exposes.
"""

from __future__ import annotations

import importlib
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

import specobs
from specobs import catalog
from specobs.sinks.otlp import OtlpSink
from specobs.timing import FakeEventClock, FakeGpu
from tests._cores import observer_factory
from tests._otlp_receiver import OtlpReceiver, ReceivedSpan, attributes_to_dict

pytestmark = pytest.mark.slow

PHASES = ("draft", "verify", "bookkeeping")
# (draft, verify, bookkeeping) GPU nanoseconds of each test cycle, and its accepted lengths.
GPU_CYCLES: list[tuple[tuple[int, int, int], list[int]]] = [
    ((100_000, 250_000, 30_000), [1, 3]),
    ((40_000, 1_200_000, 7_000), [0, 4]),
    ((15_000, 60_000, 2_500_000), [2, 2]),
]
NEVER = 3600.0  # export interval: no timer export fires during a test


@pytest.fixture(params=["grpc", "http/protobuf"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def endpoint_for(receiver: OtlpReceiver, protocol: str) -> str:
    return receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint


def transport_of(protocol: str) -> str:
    return "grpc" if protocol == "grpc" else "http"


@pytest.fixture
def observers() -> Iterator[Callable[..., specobs.Observer]]:
    """``specobs.configure`` that shuts every observer down after the test."""
    yield from observer_factory()


def run_gpu_cycles(obs: specobs.Observer, gpu: FakeGpu, cycles: list[Any]) -> None:
    for (draft, verify, book), accepted in cycles:
        with obs.cycle(batch_size=len(accepted)) as c:
            gpu.run(draft)
            c.mark("verify")
            gpu.run(verify)
            c.mark("bookkeeping")
            gpu.run(book)
            c.accept(accepted, draft_length=4)
    gpu.complete()


def latest_metrics(receiver: OtlpReceiver) -> dict[str, metrics_pb2.Metric]:
    out: dict[str, metrics_pb2.Metric] = {}
    for _, metric in receiver.metrics():
        out[metric.name] = metric  # cumulative: the last export holds the totals
    return out


def points(metric: metrics_pb2.Metric) -> dict[frozenset[tuple[str, Any]], Any]:
    data = getattr(metric, str(metric.WhichOneof("data")))
    return {frozenset(attributes_to_dict(p.attributes).items()): p for p in data.data_points}


def number(point: Any) -> float:
    return float(getattr(point, str(point.WhichOneof("value"))))


def children_of(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    kids = [s for s in spans if s.parent_span_id == parent.span_id]
    return sorted(kids, key=lambda s: s.start_time_unix_nano)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- traces ------------------------------------------------------------------------------------


def test_cycle_span_with_a_child_per_phase_timed_by_the_gpu(
    otlp_receiver: OtlpReceiver, protocol: str, observers: Callable[..., specobs.Observer]
) -> None:
    sink = OtlpSink(
        endpoint=endpoint_for(otlp_receiver, protocol), protocol=protocol,
        export_interval_seconds=NEVER, service_name="otlp-test",
    )  # fmt: skip
    mem = specobs.MemorySink()
    gpu = FakeGpu()
    obs = observers(
        sinks=[sink, mem], clock=FakeEventClock(gpu), sample_every=1, trace_head_rate=1.0
    )
    run_gpu_cycles(obs, gpu, GPU_CYCLES)
    assert obs.force_flush(5.0)

    resolved = mem.cycles
    assert [r.gpu_ns for r in resolved] == [list(d) for d, _ in GPU_CYCLES]
    spans = otlp_receiver.spans(transport=transport_of(protocol))  # type: ignore[arg-type]
    assert len(spans) == 4 * len(GPU_CYCLES)
    roots = sorted(
        (s for s in spans if s.name == "specobs.cycle"),
        key=lambda s: s.attributes["specobs.cycle.index"],
    )
    assert len(roots) == len(GPU_CYCLES)
    for root, r, (_, accepted) in zip(roots, resolved, GPU_CYCLES, strict=True):
        assert root.parent_span_id == ""
        assert r.trace_id is not None and r.span_id is not None and r.phase_span_ids
        # The resolver's ids, so Prometheus exemplars link to these spans.
        assert root.trace_id == f"{r.trace_id:032x}"
        assert root.span_id == f"{r.span_id:016x}"
        assert root.resource["service.name"] == "otlp-test"
        assert root.scope_name == "specobs"
        assert root.kind == trace_pb2.Span.SpanKind.SPAN_KIND_INTERNAL
        assert root.attributes == {
            "specobs.cycle.index": r.index,
            "specobs.clock": "gpu",
            "specobs.batch_size": len(accepted),
            "specobs.draft_tokens": 4 * len(accepted),
            "specobs.accepted_tokens": sum(accepted),
            "specobs.emitted_tokens": sum(accepted) + len(accepted),
            "specobs.host_duration_ns": sum(r.host_ns),
        }
        kids = children_of(spans, root)
        assert [k.name for k in kids] == list(PHASES)
        assert [k.span_id for k in kids] == [f"{i:016x}" for i in r.phase_span_ids]
        assert {k.trace_id for k in kids} == {root.trace_id}
        assert root.start_time_unix_nano == r.start_wall_ns == kids[0].start_time_unix_nano
        assert r.gpu_ns is not None
        for i, kid in enumerate(kids):
            assert kid.end_time_unix_nano - kid.start_time_unix_nano == r.gpu_ns[i]
            assert kid.attributes == {
                "specobs.clock": "gpu",
                "specobs.cycle.index": r.index,
                "specobs.host_duration_ns": r.host_ns[i],
            }
            if i:
                assert kid.start_time_unix_nano == kids[i - 1].end_time_unix_nano
        assert root.end_time_unix_nano == kids[-1].end_time_unix_nano
        assert root.end_time_unix_nano - root.start_time_unix_nano == sum(r.gpu_ns)
    starts = [root.start_time_unix_nano for root in roots]
    assert starts == sorted(starts)


def test_host_clock_cycles_are_traced_with_host_durations(
    otlp_receiver: OtlpReceiver, observers: Callable[..., specobs.Observer]
) -> None:
    sink = OtlpSink(endpoint=otlp_receiver.grpc_endpoint, export_interval_seconds=NEVER)
    mem = specobs.MemorySink()
    obs = observers(sinks=[sink, mem], clock="host", trace_head_rate=1.0)
    for _ in range(2):
        with obs.cycle() as c:
            c.mark("verify")
            c.mark("bookkeeping")
    assert obs.force_flush(5.0)

    spans = otlp_receiver.spans()
    for r in mem.cycles:
        assert r.gpu_ns is None
        (root,) = [s for s in spans if s.span_id == f"{r.span_id:016x}"]
        assert root.attributes["specobs.clock"] == "host"
        assert "specobs.draft_tokens" not in root.attributes  # no acceptance was recorded
        kids = children_of(spans, root)
        assert [k.end_time_unix_nano - k.start_time_unix_nano for k in kids] == r.host_ns
        assert root.end_time_unix_nano - root.start_time_unix_nano == sum(r.host_ns)


def test_tail_sampling_traces_only_the_slow_cycles(
    otlp_receiver: OtlpReceiver, observers: Callable[..., specobs.Observer]
) -> None:
    sink = OtlpSink(endpoint=otlp_receiver.grpc_endpoint, export_interval_seconds=NEVER)
    mem = specobs.MemorySink()
    gpu = FakeGpu()
    obs = observers(
        sinks=[sink, mem], clock=FakeEventClock(gpu), sample_every=1,
        trace_head_rate=0.0, trace_slow_cycle_seconds=0.001,
    )  # fmt: skip
    fast = ((100_000, 200_000, 50_000), [1])  # 0.35 ms
    slow = ((100_000, 1_500_000, 50_000), [1])  # 1.65 ms
    pattern = [fast, slow, fast, fast, slow, fast]
    run_gpu_cycles(obs, gpu, pattern)
    assert obs.force_flush(5.0)

    slow_indices = {r.index for r, p in zip(mem.cycles, pattern, strict=True) if p is slow}
    assert len(slow_indices) == 2
    assert {r.index for r in mem.cycles if r.trace_id is not None} == slow_indices
    spans = otlp_receiver.spans()
    roots = [s for s in spans if s.name == "specobs.cycle"]
    assert {s.attributes["specobs.cycle.index"] for s in roots} == slow_indices
    assert len(spans) == 4 * len(slow_indices)


# -- metrics -----------------------------------------------------------------------------------


def test_metrics_are_the_snapshot_under_the_catalog_names(
    otlp_receiver: OtlpReceiver, protocol: str, observers: Callable[..., specobs.Observer]
) -> None:
    sink = OtlpSink(
        endpoint=endpoint_for(otlp_receiver, protocol), protocol=protocol,
        export_interval_seconds=NEVER,
    )  # fmt: skip
    gpu = FakeGpu()
    labels = {"model": "tiny", "engine": "test"}
    obs = observers(
        sinks=[sink], clock=FakeEventClock(gpu), sample_every=1, trace_head_rate=1.0,
        labels=labels, baseline_tokens_per_second=31.5, max_draft_length=4,
    )  # fmt: skip
    obs.set_requests(running=3, waiting=1)
    obs.request_finished(drafted=8, accepted=2)  # the request series exist once one is reported
    obs.drafts_unverified(3)  # so does the count of drafts left out of verification
    run_gpu_cycles(obs, gpu, GPU_CYCLES)
    assert obs.force_flush(5.0)
    snap = obs.snapshot()

    received = latest_metrics(otlp_receiver)
    # sample_every=1: a fixed interval, which no budget steers, so no budget gauge.
    assert set(received) == {m.otel_name for m in catalog.CATALOG
                             if m is not catalog.SAMPLING_BUDGET}
    assert {r.transport for r in otlp_receiver.requests(signal="metrics")} == {
        transport_of(protocol)
    }
    created_ns = snap.created_unix_nano

    def hist_points(m: catalog.Metric) -> dict[frozenset[tuple[str, Any]], Any]:
        metric = received[m.otel_name]
        assert metric.WhichOneof("data") == "histogram"
        assert metric.unit == m.unit
        assert (
            metric.histogram.aggregation_temporality
            == metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
        )
        return points(metric)

    def check_hist(p: Any, h: specobs.HistogramData, bounds: tuple[float, ...]) -> None:
        assert tuple(p.explicit_bounds) == bounds == h.bounds
        assert tuple(p.bucket_counts) == h.counts
        assert p.count == h.count
        assert p.sum == pytest.approx(h.sum, rel=1e-12)
        assert p.start_time_unix_nano == created_ns
        assert p.time_unix_nano > created_ns

    ph = hist_points(catalog.PHASE_DURATION)
    assert len(ph) == 2 * len(PHASES)
    for (phase, clock), h in snap.phase_histograms.items():
        key = frozenset({**labels, "phase": phase, "clock": clock}.items())
        check_hist(ph[key], h, catalog.DURATION_BUCKETS_SECONDS)
    gpu_draft = snap.phase_histograms[("draft", "gpu")]
    assert gpu_draft.count == len(GPU_CYCLES)
    cy = hist_points(catalog.CYCLE_DURATION)
    for clock, h in snap.cycle_histograms.items():
        check_hist(cy[frozenset({**labels, "clock": clock}.items())], h,
                   catalog.DURATION_BUCKETS_SECONDS)  # fmt: skip
    const = frozenset(labels.items())
    check_hist(hist_points(catalog.ACCEPT_LENGTH)[const], snap.accept_length,
               catalog.accept_length_buckets(4))  # fmt: skip
    check_hist(hist_points(catalog.BATCH_SIZE)[const], snap.batch_size,
               catalog.BATCH_SIZE_BUCKETS)  # fmt: skip

    # Exemplars point at the spans that were exported.
    span_ids = {(s.trace_id, s.span_id) for s in otlp_receiver.spans()}
    exemplars = [
        (e.trace_id.hex(), e.span_id.hex())
        for p in ph.values() for e in p.exemplars
    ]  # fmt: skip
    assert exemplars and set(exemplars) <= span_ids

    def counter_points(m: catalog.Metric) -> dict[frozenset[tuple[str, Any]], float]:
        metric = received[m.otel_name]
        assert metric.WhichOneof("data") == "sum", m.otel_name
        assert metric.sum.is_monotonic
        assert (
            metric.sum.aggregation_temporality
            == metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
        )
        for p in metric.sum.data_points:
            assert p.start_time_unix_nano == created_ns
        return {k: number(p) for k, p in points(metric).items()}

    def with_label(key: str, value: str) -> frozenset[tuple[str, Any]]:
        return frozenset({**labels, key: value}.items())

    assert counter_points(catalog.CYCLES) == {const: snap.cycles_total} == {const: 3}
    assert counter_points(catalog.DRAFT_TOKENS) == {const: snap.draft_tokens_total}
    assert counter_points(catalog.ACCEPTED_TOKENS) == {const: snap.accepted_tokens_total}
    assert counter_points(catalog.EMITTED_TOKENS) == {const: snap.emitted_tokens_total}
    assert snap.accepted_tokens_total == sum(sum(a) for _, a in GPU_CYCLES)
    assert counter_points(catalog.SAMPLED_CYCLES) == {const: snap.sampled_cycles_total}
    assert counter_points(catalog.ACCEPTED_BY_POSITION) == {
        with_label("position", str(i)): v for i, v in enumerate(snap.accepted_by_position)
    }
    assert counter_points(catalog.DRAFTED_BY_POSITION) == {
        with_label("position", str(i)): v for i, v in enumerate(snap.drafted_by_position)
    }
    assert counter_points(catalog.DROPPED_RECORDS) == {
        with_label("reason", r): snap.dropped[r] for r in catalog.DROP_REASONS
    }
    assert counter_points(catalog.ERRORS) == {
        with_label("kind", k): snap.errors[k] for k in catalog.ERROR_KINDS
    }
    cpu = counter_points(catalog.EXPORTER_CPU)
    assert set(cpu) == {with_label("component", c) for c in snap.cpu_seconds}
    assert "otlp" in snap.cpu_seconds and snap.cpu_seconds["otlp"] > 0

    def gauge_value(m: catalog.Metric, attrs: dict[str, str] = labels) -> float:
        metric = received[m.otel_name]
        assert metric.WhichOneof("data") == "gauge", m.otel_name
        (point,) = metric.gauge.data_points
        assert attributes_to_dict(point.attributes) == attrs
        return number(point)

    assert gauge_value(catalog.INFO, {**labels, **snap.info}) == 1
    assert gauge_value(catalog.LAST_CYCLE_TIMESTAMP) == snap.last_cycle_timestamp_seconds
    assert gauge_value(catalog.BASELINE_SEQUENCE_TOKENS) == 31.5
    assert gauge_value(catalog.REQUESTS_RUNNING) == 3
    assert gauge_value(catalog.REQUESTS_WAITING) == 1
    assert gauge_value(catalog.SAMPLING_INTERVAL) == snap.sampling_interval
    assert gauge_value(catalog.OVERHEAD_RATIO) == pytest.approx(snap.overhead_ratio)


def test_unset_gauges_are_left_out_and_zeros_are_exported(
    otlp_receiver: OtlpReceiver, observers: Callable[..., specobs.Observer]
) -> None:
    sink = OtlpSink(endpoint=otlp_receiver.grpc_endpoint, export_interval_seconds=NEVER)
    obs = observers(sinks=[sink], clock="host")
    assert obs.force_flush(5.0)
    received = latest_metrics(otlp_receiver)
    unset = {
        catalog.LAST_CYCLE_TIMESTAMP, catalog.BASELINE_SEQUENCE_TOKENS,
        catalog.REQUESTS_RUNNING, catalog.REQUESTS_WAITING,
        catalog.WORKER_THREAD_TIME,  # no cycle, so no recording thread yet
        catalog.REQUEST_ACCEPTANCE, catalog.REQUESTS_FINISHED,  # no request reported yet
        catalog.DRAFT_TOKENS_UNVERIFIED,  # no draft left out of verification reported yet
        # no cycle yet, so no draft length seen
        catalog.CYCLES_BY_DRAFT_LENGTH, catalog.PHASE_TIME_BY_DRAFT_LENGTH,
        catalog.EMITTED_BY_DRAFT_LENGTH, catalog.SEQUENCES_BY_DRAFT_LENGTH,
        catalog.ACCEPTED_BY_DRAFT_LENGTH, catalog.DRAFTED_BY_DRAFT_LENGTH,
    }  # fmt: skip
    assert set(received) == {m.otel_name for m in catalog.CATALOG if m not in unset}
    # No GPU-timed cycle yet: the gpu series exist, with zero counts, as on the scrape path.
    gpu_points = [
        p for k, p in points(received[catalog.PHASE_DURATION.otel_name]).items()
        if ("clock", "gpu") in k
    ]  # fmt: skip
    assert len(gpu_points) == len(PHASES)
    assert all(p.count == 0 and sum(p.bucket_counts) == 0 for p in gpu_points)


def test_metrics_are_pushed_periodically(
    otlp_receiver: OtlpReceiver, observers: Callable[..., specobs.Observer]
) -> None:
    sink = OtlpSink(
        endpoint=otlp_receiver.http_endpoint, protocol="http/protobuf",
        export_interval_seconds=0.1, traces=False,
    )  # fmt: skip
    assert not sink.wants_traces
    observers(sinks=[sink], clock="host")
    assert otlp_receiver.wait_for(
        lambda: len(otlp_receiver.requests(signal="metrics")) >= 2, timeout_seconds=5.0
    )
    assert otlp_receiver.requests(signal="traces") == []


# -- configuration -----------------------------------------------------------------------------



def _one_traced_cycle(observers: Callable[..., specobs.Observer], sink: OtlpSink) -> None:
    """One cycle, traced, through an observer exporting to ``sink`` only, flushed."""
    obs = observers(sinks=[sink], clock="host", trace_head_rate=1.0)
    with obs.cycle() as c:
        c.mark("verify")
        c.mark("bookkeeping")
    assert obs.force_flush(5.0)


def test_standard_environment_variables(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch,
    observers: Callable[..., specobs.Observer],
) -> None:  # fmt: skip
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.http_endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-specobs-key=s3cret")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "5")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,team=infer")
    sink = OtlpSink(export_interval_seconds=NEVER)
    assert (sink.traces_protocol, sink.metrics_protocol) == ("http/protobuf", "http/protobuf")
    _one_traced_cycle(observers, sink)

    requests = otlp_receiver.requests()
    assert {(r.transport, r.signal) for r in requests} == {("http", "traces"), ("http", "metrics")}
    assert all(r.headers.get("x-specobs-key") == "s3cret" for r in requests)
    for resource, _ in otlp_receiver.metrics():
        assert resource["service.name"] == "from-env"
        assert resource["deployment.environment"] == "test"
        assert resource["team"] == "infer"
    (root,) = [s for s in otlp_receiver.spans() if s.name == "specobs.cycle"]
    assert root.resource["service.name"] == "from-env"


def test_per_signal_variables(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch,
    observers: Callable[..., specobs.Observer],
) -> None:  # fmt: skip
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{otlp_receiver.http_endpoint}/v1/traces"
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", otlp_receiver.grpc_endpoint)
    sink = OtlpSink(export_interval_seconds=NEVER)
    _one_traced_cycle(observers, sink)
    assert {(r.transport, r.signal) for r in otlp_receiver.requests()} == {
        ("http", "traces"), ("grpc", "metrics"),
    }  # fmt: skip


def test_arguments_override_environment_variables(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch,
    observers: Callable[..., specobs.Observer],
) -> None:  # fmt: skip
    dead = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", dead)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", dead)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=infer,region=env")
    sink = OtlpSink(
        endpoint=otlp_receiver.grpc_endpoint, protocol="grpc", headers={"x-arg": "1"},
        timeout_seconds=5, service_name="from-arg", resource_attributes={"region": "arg"},
        export_interval_seconds=NEVER,
    )  # fmt: skip
    _one_traced_cycle(observers, sink)
    requests = otlp_receiver.requests()
    assert {(r.transport, r.signal) for r in requests} == {("grpc", "traces"), ("grpc", "metrics")}
    assert all(r.headers.get("x-arg") == "1" for r in requests)
    resource = otlp_receiver.spans()[0].resource
    assert resource["service.name"] == "from-arg"
    assert (resource["team"], resource["region"]) == ("infer", "arg")


def test_bad_protocol_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(specobs.ConfigurationError, match=r"protocol must be 'grpc' or "
                       r"'http/protobuf', got 'http/json'"):  # fmt: skip
        OtlpSink(protocol="http/json")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "udp")
    with pytest.raises(specobs.ConfigurationError, match=r"OTEL_EXPORTER_OTLP_PROTOCOL .*'udp'"):
        OtlpSink()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "HTTP")
    with pytest.raises(specobs.ConfigurationError, match="OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"):
        OtlpSink()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_queue_size": 0}, "max_queue_size must be an integer >= 1, got 0"),
        ({"export_interval_seconds": 0}, "export_interval_seconds must be .* > 0, got 0"),
        ({"timeout_seconds": "soon"}, "timeout_seconds must be .* > 0, got 'soon'"),
        ({"traces": False, "metrics": False}, "would export nothing"),
        ({"endpoint": " "}, "endpoint must be a URL"),
    ],
)
def test_bad_arguments_are_configuration_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(specobs.ConfigurationError, match=message):
        OtlpSink(**kwargs)


def test_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)
    monkeypatch.delitem(sys.modules, "specobs.sinks.otlp")
    with pytest.raises(specobs.MissingDependencyError, match=r"pip install 'specobs\[otlp\]'"):
        importlib.import_module("specobs.sinks.otlp")


def test_public_name() -> None:
    assert specobs.OtlpSink is OtlpSink
    assert specobs.sinks.OtlpSink is OtlpSink


# -- a collector that is down or slow ----------------------------------------------------------


def test_collector_down_costs_bounded_memory_and_counted_drops(
    otlp_receiver: OtlpReceiver, protocol: str, observers: Callable[..., specobs.Observer]
) -> None:
    # The receiver is not the target here (the endpoint is a closed port); it only polls.
    n_cycles = 400
    queue = 16
    sink = OtlpSink(
        endpoint=f"http://127.0.0.1:{closed_port()}", protocol=protocol, timeout_seconds=0.5,
        max_queue_size=queue, export_interval_seconds=NEVER,
    )  # fmt: skip
    obs = observers(sinks=[sink], clock="host", trace_head_rate=1.0)
    most_in_flight = 0
    t0 = time.monotonic()
    for i in range(n_cycles):
        with obs.cycle(batch_size=1) as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept([1], draft_length=2)
        if i % 8 == 0:
            most_in_flight = max(most_in_flight, sink.spans_in_flight)
    loop_seconds = time.monotonic() - t0
    assert loop_seconds < 2.0  # the worker never waited for the collector

    assert not obs.force_flush(3.0)  # the collector refused: not delivered
    snap = obs.snapshot()
    assert snap.cycles_total == n_cycles
    assert snap.dropped["span_export"] > 0
    assert snap.dropped["metric_export"] >= 1
    assert most_in_flight <= queue and sink.spans_in_flight <= queue

    t0 = time.monotonic()
    obs.shutdown(1.0)
    assert time.monotonic() - t0 < 2.0
    # Every span of every traced cycle is accounted for exactly once.
    spans_total = 4 * n_cycles

    assert otlp_receiver.wait_for(
        lambda: obs.snapshot().dropped["span_export"] == spans_total, timeout_seconds=5.0
    ), obs.snapshot().dropped
    assert otlp_receiver.requests() == []


def test_slow_collector_never_blocks_flush_or_shutdown_beyond_their_timeout(
    otlp_receiver: OtlpReceiver, protocol: str, observers: Callable[..., specobs.Observer]
) -> None:
    otlp_receiver.delay_seconds = 30.0
    sink = OtlpSink(
        endpoint=endpoint_for(otlp_receiver, protocol), protocol=protocol,
        export_interval_seconds=NEVER,
    )  # fmt: skip
    obs = observers(sinks=[sink], clock="host", trace_head_rate=1.0)
    t0 = time.monotonic()
    for _ in range(50):
        with obs.cycle() as c:
            c.mark("verify")
            c.mark("bookkeeping")
    assert time.monotonic() - t0 < 1.0

    t0 = time.monotonic()
    assert not obs.force_flush(0.5)
    assert time.monotonic() - t0 < 1.5
    assert obs.snapshot().cycles_total == 50

    t0 = time.monotonic()
    obs.shutdown(1.0)
    assert time.monotonic() - t0 < 2.0
