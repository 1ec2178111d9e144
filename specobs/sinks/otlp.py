"""OTLP export of the observer's aggregation (metrics) and of sampled cycles (traces).

Metrics
    The one aggregation, read through the source the sink is attached to (its ``snapshot()``:
    sinks never see the observer) and turned into the SDK's export data
    types (``MetricsData`` → ``ResourceMetrics`` → ``ScopeMetrics`` → ``Metric`` with ``Sum``,
    ``Gauge`` and ``Histogram`` points), handed to the official ``OTLPMetricExporter``. No SDK
    instrument is ever called per value: one export builds O(series) points from one snapshot.
    Histograms carry the catalog's explicit bucket boundaries (the same as the Prometheus
    ``le`` buckets) and the aggregation's exemplars (trace and span ids of traced cycles); every
    counter is a monotonic cumulative ``Sum``; temporality is cumulative with the start time of
    the observer, so a failed export loses nothing (the next one resends the totals). Constant
    labels are point attributes, so after a Collector's ``prometheus`` exporter every series has
    the same name and labels as on the scrape path. Gauges that were never set (no baseline
    configured, the engine never reported its requests, no cycle yet) are left out, exactly as the
    Prometheus sink leaves them out; every other series is always exported, zeros included.

    Why our own thread and not a ``PeriodicExportingMetricReader``: this SDK version (1.45) has no
    ``MetricProducer`` hook on its readers, and a reader only exports what SDK instruments
    recorded — which would mean a second copy of the aggregation. A daemon thread,
    ``specobs-otlp``, wakes every ``export_interval_seconds`` (default 10 s) and on
    ``force_flush``/``shutdown``, takes one snapshot and calls ``exporter.export()``. All blocking
    network work happens on that thread; ``force_flush`` and ``shutdown`` only wait for it, up to
    their timeout.

Traces
    For every resolved cycle the resolver picked for tracing (head rate plus the slow-cycle tail
    threshold; the resolver assigns the trace and span ids, so Prometheus exemplars point at these
    very spans), one ``specobs.cycle`` span with a child span per phase named after the phase.
    They are built directly as SDK ``ReadableSpan`` objects — no tracer, no context, no per-span
    ``start``/``end`` — and fed to an SDK ``BatchSpanProcessor(OTLPSpanExporter)``. Timestamps: the
    cycle starts at its wall-clock start (the host stamp of its first boundary, anchored to Unix
    time); the children follow back to back, each lasting its GPU duration when the cycle was
    GPU-timed (``specobs.clock = "gpu"``), else its host duration (``"host"``); the parent ends at
    start + the sum. Attributes: ``specobs.cycle.index``, ``specobs.clock``,
    ``specobs.batch_size`` and, when the cycle recorded acceptance, ``specobs.draft_tokens``,
    ``specobs.accepted_tokens``, ``specobs.emitted_tokens``; every span also carries its
    host-clock duration as ``specobs.host_duration_ns`` (an int). The cycle span carries the
    OpenTelemetry GenAI attributes of the resource as well (``gen_ai.provider.name``,
    ``gen_ai.request.model``, ``gen_ai.response.model``, ``server.address``, ``server.port``:
    :mod:`specobs.sinks._otlp_genai`).

Bounded memory, counted drops (``specobs_exporter_dropped_records_total{reason="span_export"}``)
    At most ``max_queue_size`` spans are in flight (handed to the processor and not yet taken by
    the exporter). When a traced cycle's spans do not fit, the whole cycle's spans are refused
    before the processor sees them, so the processor's own queue never overflows and every lost
    span is counted exactly once. Counted in ``dropped["span_export"]``, in spans:

    * spans refused because ``max_queue_size`` spans were already in flight (collector slow or
      down);
    * spans of a batch the exporter reported as failed (after its own retries), or that raised;
    * spans still queued when ``shutdown`` ran out of time, and spans offered after shutdown.

    ``dropped["metric_export"]`` counts metric exports that failed (one per export; the next one
    resends the cumulative values).

Collectors that misbehave
    Every export ends within the exporter's timeout (``timeout_seconds``, else
    ``OTEL_EXPORTER_OTLP_TIMEOUT``, else 10 s), retries included, whatever the collector sends:
    gRPC enforces its deadline itself (and caps a received message at 4 MiB); for
    http/protobuf, specobs gives the exporter a ``requests`` session whose requests end at that
    deadline even when the collector trickles its answer a byte at a time, and which reads at
    most 1 MiB of a response (:mod:`specobs.sinks._otlp_config`). An export cut short is a
    failed export, counted as above when it ends.

fork()
    A forked child rebuilds the sink (:meth:`OtlpSink.after_fork_in_child`) and exports its own
    series. With gRPC, ``fork()`` waits (at most 0.5 s) for an export of this module in
    progress, so that gRPC's fork handlers can run; a child forked while one was still running
    cannot use gRPC safely (gRPC core aborts or hangs such children), so its sink stays off and
    says so in one warning. ``GRPC_ENABLE_FORK_SUPPORT`` is left alone: with exports in flight
    it made parents and children hang.

Configuration
    The standard ``OTEL_*`` variables, read when the sink is attached, mean what they mean to
    every other Python OpenTelemetry program; constructor arguments override them; a user and
    password in the endpoint URL are sent as HTTP Basic and never printed (docs/integrations.md,
    "OTLP configuration").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from specobs._config import DEFAULT_OTLP_FORK_WAIT_SECONDS, otlp_fork_wait_seconds
from specobs._errors import ConfigurationError, require
from specobs._model import ResolvedCycle, Snapshot
from specobs.sinks._base import MetricSource, Sink

require("opentelemetry.sdk", feature="OTLP export", extra="otlp")

from opentelemetry.sdk.metrics.export import (  # noqa: E402
    MetricExporter,
    MetricExportResult,
)
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: E402

from specobs.sinks._otlp_config import (  # noqa: E402
    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    check_sink_arguments,
    make_metric_exporter,
    make_span_exporter,
    positive_seconds,
    redact_url,
    resolve_protocol,
)
from specobs.sinks._otlp_data import cycle_spans, metrics_data  # noqa: E402
from specobs.sinks._otlp_export import (  # noqa: E402
    CountingSpanExporter,
    FlushRequest,
    GrpcForkGate,
)
from specobs.sinks._otlp_genai import (  # noqa: E402
    observer_defaults,
    sink_resource,
    span_attributes,
)

__all__ = ["OtlpSink"]

_log = logging.getLogger("specobs")

DEFAULT_EXPORT_INTERVAL_SECONDS = 10.0
DEFAULT_MAX_QUEUE_SIZE = 2048
_MAX_EXPORT_BATCH_SIZE = 512
# How often the span processor exports without being asked (it also wakes when a batch fills).
_SPAN_SCHEDULE_DELAY_MILLIS = 1000.0
#: How long ``fork()`` waits for specobs's own gRPC export in progress to end (see
#: GrpcForkGate): ``SPECOBS_OTLP_FORK_WAIT_SECONDS``, read when a gRPC sink is made.
_FORK_WAIT_SECONDS = DEFAULT_OTLP_FORK_WAIT_SECONDS

_GRPC_FORK_GATE = GrpcForkGate(lambda: _FORK_WAIT_SECONDS)

# The clocks metric points are stamped from (OtlpSink.now_ns); module attributes so that a test
# can step the wall clock without touching the real one.
_wall_clock_ns = time.time_ns
_monotonic_ns = time.perf_counter_ns
# Exporters a forked child inherited: kept referenced and never closed there (see
# OtlpSink.after_fork_in_child).
_PARENT_EXPORTERS: list[object] = []



class OtlpSink(Sink):
    """Push the aggregation as OTLP metrics, and sampled cycles as OTLP traces.

    >>> sink = OtlpSink(endpoint="http://collector:4317")            # doctest: +SKIP
    >>> obs = specobs.configure(sinks=[sink], trace_slow_cycle_seconds=0.05)  # doctest: +SKIP

    Arguments override the standard ``OTEL_*`` variables (see the module docstring). The GenAI
    arguments set ``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
    ``server.address`` and ``server.port`` on the resource and on every cycle span, over their
    variables (docs/configuration.md); unset, the provider and the models come from the
    observer's ``serving_engine`` and ``model_name`` labels and its integration
    (docs/otel-genai.md). :attr:`endpoint` is the URL without any user and password it carried
    (those are sent as a Basic ``authorization`` header).

    Args:
        endpoint: the collector's base URL.
        protocol: ``"grpc"`` or ``"http/protobuf"``.
        headers: sent with every export.
        timeout_seconds: per export, retries included.
        service_name: the resource's ``service.name``.
        resource_attributes: merged over ``OTEL_RESOURCE_ATTRIBUTES``.
        provider_name: ``gen_ai.provider.name``.
        request_model: ``gen_ai.request.model``.
        response_model: ``gen_ai.response.model``.
        server_address: ``server.address``.
        server_port: ``server.port``.
        export_interval_seconds: the metric push period.
        traces: whether cycle spans are exported.
        metrics: whether metrics are exported.
        max_queue_size: the spans in flight at most.

    Raises:
        ConfigurationError: an invalid argument or variable.
    """

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        protocol: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float | None = None,
        service_name: str | None = None,
        resource_attributes: Mapping[str, str | bool | int | float] | None = None,
        provider_name: str | None = None,
        request_model: str | None = None,
        response_model: str | None = None,
        server_address: str | None = None,
        server_port: int | None = None,
        export_interval_seconds: float = DEFAULT_EXPORT_INTERVAL_SECONDS,
        traces: bool = True,
        metrics: bool = True,
        max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
    ) -> None:
        environ = os.environ
        check_sink_arguments(traces, metrics, max_queue_size, endpoint)
        # The URL as given (it may carry credentials), and as it may be shown.
        self._endpoint = None if endpoint is None else endpoint.strip()
        self.endpoint = None if self._endpoint is None else redact_url(self._endpoint)
        self.traces_protocol = resolve_protocol(
            protocol, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, environ
        )
        self.metrics_protocol = resolve_protocol(
            protocol, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, environ
        )
        self.headers = None if headers is None else dict(headers)
        self.timeout_seconds = (
            None if timeout_seconds is None
            else positive_seconds("timeout_seconds", timeout_seconds)
        )
        self.export_interval_seconds = positive_seconds(
            "export_interval_seconds", export_interval_seconds
        )
        self.max_queue_size = max_queue_size
        self.wants_traces = bool(traces)
        self.metrics = bool(metrics)
        if self._uses_grpc():
            global _FORK_WAIT_SECONDS
            _FORK_WAIT_SECONDS = otlp_fork_wait_seconds(environ)
        self.resource = sink_resource(
            {"provider_name": provider_name, "request_model": request_model,
             "response_model": response_model, "server_address": server_address,
             "server_port": server_port},
            resource_attributes, service_name, environ,
        )  # fmt: skip
        self._init_export_state()
        self._init_thread_state()

    def _init_export_state(self) -> None:
        """The clocks' anchor, the exporters (made on attach) and the span accounting."""
        self._anchor_monotonic_ns = _monotonic_ns()
        self._anchor_wall_ns = _wall_clock_ns()
        self._lock = threading.Lock()
        self._closed = False
        self._attached = False
        self._submitted = 0  # spans handed to the processor
        self._failed_span_batches = 0
        self._span_exporter: CountingSpanExporter | None = None
        self._processor: BatchSpanProcessor | None = None
        self._metric_exporter: MetricExporter | None = None
        self._exporters_shut = False
        self._span_attributes = span_attributes(self.resource.attributes)

    def _init_thread_state(self) -> None:
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._stopping = False
        self._metrics_exporting = False
        self._metrics_abandoned = False
        self._requests: list[FlushRequest] = []
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def attach(self, source: MetricSource) -> None:
        if self._attached:
            raise ConfigurationError(
                "this OtlpSink is already attached to an observer; create one sink per observer"
            )
        super().attach(source)
        self._attached = True
        source.add_cpu("otlp", 0.0)  # the component is exported from the start, at zero
        self._add_observer_defaults(source)
        try:
            if self.wants_traces:
                inner = make_span_exporter(
                    self.traces_protocol, self._endpoint, self.headers, self.timeout_seconds)
                self._span_exporter = CountingSpanExporter(
                    inner, self._exported_spans, self._gate(self.traces_protocol))
                self._processor = BatchSpanProcessor(
                    self._span_exporter,
                    max_queue_size=self.max_queue_size,
                    schedule_delay_millis=_SPAN_SCHEDULE_DELAY_MILLIS,
                    max_export_batch_size=min(_MAX_EXPORT_BATCH_SIZE, self.max_queue_size),
                )
            if self.metrics:
                self._metric_exporter = make_metric_exporter(
                    self.metrics_protocol, self._endpoint, self.headers, self.timeout_seconds)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise ConfigurationError(
                f"could not create the OTLP exporter from the OTEL_EXPORTER_OTLP_* variables "
                f"and arguments: {exc}"
            ) from exc
        self._start_thread()

    def _add_observer_defaults(self, source: MetricSource) -> None:
        """The GenAI attributes the observer implies (its constant labels and integration),
        where nothing configured them: added to the resource and the cycle spans."""
        snapshot = source.snapshot()
        defaults = observer_defaults(
            self.resource.attributes, snapshot.labels, snapshot.info.get("integration"))
        if defaults:
            # merge(): the argument's values win, so every configured attribute stays.
            self.resource = Resource(defaults).merge(self.resource)
            self._span_attributes = span_attributes(self.resource.attributes)

    @staticmethod
    def _gate(protocol: str) -> AbstractContextManager[Any]:
        return _GRPC_FORK_GATE if protocol == "grpc" else nullcontext()

    def _uses_grpc(self) -> bool:
        return ((self.wants_traces and self.traces_protocol == "grpc")
                or (self.metrics and self.metrics_protocol == "grpc"))

    def _start_thread(self) -> None:
        t = threading.Thread(target=self._run, name="specobs-otlp", daemon=True)
        self._thread = t
        t.start()

    def after_fork_in_child(self) -> None:
        """Called by the observer in a forked child, after it zeroed its totals.

        Threads do not survive fork(); the span processor restarts its own with an empty queue
        (the parent exports what it had queued). The exporters are made anew (a gRPC channel or
        an HTTP session is not shared across processes), nothing is counted as in flight, and
        the child's cumulative series start at its own new start time. The parent's exporters
        are kept, untouched: closing a gRPC channel of the parent in the child is itself a gRPC
        call.

        With gRPC, a child forked while one of specobs's exports was still in progress (past
        :data:`_FORK_WAIT_SECONDS`) cannot use gRPC safely (see
        :class:`~specobs.sinks._otlp_export.GrpcForkGate`): the sink stays off in that child,
        says so in one warning, and counts the spans it refuses as ``span_export`` drops. The
        process itself is never put at risk.
        """
        self._lock = threading.Lock()
        if self._closed or not self._attached:
            return
        _PARENT_EXPORTERS.extend(
            e for e in (self._span_exporter and self._span_exporter.inner, self._metric_exporter)
            if e is not None)
        if self._uses_grpc() and _GRPC_FORK_GATE.unsafe_here():
            _log.warning(
                "specobs: forked child (pid %d) does not export by OTLP/gRPC: fork() ran while "
                "an export to the collector was in progress, after which gRPC cannot be used "
                "safely in the child. The parent keeps exporting; for children that export, "
                "fork before configure(), use OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf, or let "
                "fork() wait longer than %g s for the export (SPECOBS_OTLP_FORK_WAIT_SECONDS).",
                os.getpid(), _FORK_WAIT_SECONDS)
            self._closed = True
            return
        try:
            if self._span_exporter is not None:
                self._span_exporter.reset_in_child(make_span_exporter(
                    self.traces_protocol, self._endpoint, self.headers, self.timeout_seconds))
            if self._metric_exporter is not None:
                self._metric_exporter = make_metric_exporter(
                    self.metrics_protocol, self._endpoint, self.headers, self.timeout_seconds)
        except Exception as exc:
            _log.warning("specobs: forked child (pid %d) cannot export by OTLP: %r",
                         os.getpid(), exc)
            self._closed = True
            return
        self._submitted = 0
        self._failed_span_batches = 0
        self._exporters_shut = False
        self._init_thread_state()
        self._start_thread()

    def force_flush(self, timeout_seconds: float) -> bool:
        """Export the queued spans, then the metrics, on the export thread; never waits
        longer than ``timeout_seconds``.

        Args:
            timeout_seconds: how long the call may take.

        Returns:
            True when both were delivered in time; False on timeout or when the collector
            refused them (what was refused is counted).
        """
        if not self._attached or self._closed:
            return False
        req = FlushRequest()
        with self._lock:
            self._requests.append(req)
        self._wake.set()
        return req.done.wait(max(0.0, timeout_seconds)) and req.ok

    def shutdown(self, timeout_seconds: float) -> None:
        """Export what is left and stop, within ``timeout_seconds`` whatever the collector does.

        If the export thread has not finished by then, the exporters are shut down at once
        (aborting their retries and cancelling in-flight gRPC calls) and every span not yet taken
        by the exporter is counted as dropped. Idempotent.

        Args:
            timeout_seconds: how long the call may take.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stopping = True
        if not self._attached:
            return
        self._wake.set()
        exp = self._span_exporter
        if not self._stopped.wait(max(0.0, timeout_seconds)):
            _log.warning(
                "specobs: OTLP export did not finish within %.3g s; dropping what is left",
                timeout_seconds,
            )
            # What is being exported right now is lost too (the process may end first).
            if exp is not None:
                self._count_dropped("span_export", exp.abandon())
            # The final metric export did not complete (still running, or never reached).
            with self._lock:
                self._metrics_abandoned = True
            if self._metric_exporter is not None:
                self._count_dropped("metric_export", 1)
        self._shutdown_exporters()
        if exp is not None:
            exp.close()
            with self._lock:
                lost = self._submitted - exp.received
                self._submitted = exp.received
            self._count_dropped("span_export", lost)

    # -- resolver thread -------------------------------------------------------------------------
    def on_cycles(self, cycles: Sequence[ResolvedCycle]) -> None:
        processor = self._processor
        exp = self._span_exporter
        if processor is None or exp is None:
            return
        refused = 0
        spans: list[ReadableSpan] = []
        with self._lock:
            closed = self._closed
            room = self.max_queue_size - (self._submitted - exp.received)
        for r in cycles:
            if r.trace_id is None or r.span_id is None:
                continue
            need = 1 + len(r.host_ns)
            if closed or need > room:
                refused += need
                continue
            room -= need
            spans.extend(cycle_spans(r, self.resource, self._span_attributes))
        if spans:
            with self._lock:
                # shutdown() may have counted the in-flight spans meanwhile: count these here.
                if self._closed:
                    refused += len(spans)
                    spans = []
                else:
                    self._submitted += len(spans)
            for span in spans:
                processor.on_end(span)
        if refused:
            self._count_dropped("span_export", refused)

    # -- accounting (any thread) -----------------------------------------------------------------
    def _count_dropped(self, reason: str, n: int) -> None:
        self.source.count_dropped(reason, n)

    def _exported_spans(self, n: int, ok: bool, cpu_ns: int) -> None:
        if not ok:
            self.source.count_dropped("span_export", n)
        self.source.add_cpu("otlp", cpu_ns / 1e9)
        if not ok:
            with self._lock:
                self._failed_span_batches += 1

    @property
    def spans_in_flight(self) -> int:
        """Spans handed to the processor and not yet taken by the exporter (≤ max_queue_size)."""
        exp = self._span_exporter
        if exp is None:
            return 0
        with self._lock:
            return self._submitted - exp.received

    # -- export thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        interval = self.export_interval_seconds
        next_due = time.monotonic() + interval
        try:
            while True:
                self._wake.wait(max(0.0, next_due - time.monotonic()))
                self._wake.clear()
                with self._lock:
                    requests = self._requests
                    self._requests = []
                    stopping = self._stopping
                if requests or stopping or time.monotonic() >= next_due:
                    ok = self._export(flush_spans=bool(requests) or stopping)
                    next_due = time.monotonic() + interval
                    for req in requests:
                        req.ok = ok
                        req.done.set()
                if stopping:
                    break
            processor = self._processor
            if processor is not None:
                # Joins the processor's thread; its last export finds nothing left.
                processor.shutdown()  # type: ignore[no-untyped-call]
            self._shutdown_exporters()
        except Exception as exc:  # never let a thread die with a traceback
            _log.warning("specobs: OTLP export thread failed: %r", exc)
        finally:
            self._stopped.set()

    def _export(self, *, flush_spans: bool) -> bool:
        ok = True
        processor = self._processor
        if flush_spans and processor is not None:
            with self._lock:
                failed_before = self._failed_span_batches
            try:
                processor.force_flush()
            except Exception as exc:
                _log.warning("specobs: OTLP span flush failed: %r", exc)
                ok = False
            with self._lock:
                ok = ok and self._failed_span_batches == failed_before
        exporter = self._metric_exporter
        if exporter is not None:
            t0 = time.thread_time_ns()
            with self._lock:
                self._metrics_exporting = True
            try:
                data = self.metrics_data(self.source.snapshot())
                # The exporter bounds the call itself (its timeout covers the retries).
                with self._gate(self.metrics_protocol):
                    result = exporter.export(data)
                metrics_ok = result is MetricExportResult.SUCCESS
            except Exception as exc:
                _log.warning("specobs: OTLP metric export raised: %r", exc)
                metrics_ok = False
            with self._lock:
                self._metrics_exporting = False
                counted = self._metrics_abandoned  # shutdown() counted it when it gave up
            self.source.add_cpu("otlp", (time.thread_time_ns() - t0) / 1e9)
            if not metrics_ok and not counted:
                self.source.count_dropped("metric_export", 1)
            ok = ok and metrics_ok
        return ok

    def _shutdown_exporters(self) -> None:
        with self._lock:
            if self._exporters_shut:
                return
            self._exporters_shut = True
        if self._span_exporter is not None:
            self._span_exporter.shutdown()
        if self._metric_exporter is not None:
            try:
                with self._gate(self.metrics_protocol):
                    self._metric_exporter.shutdown()
            except Exception as exc:
                _log.warning("specobs: OTLP metric exporter shutdown failed: %r", exc)

    def metrics_data(self, s: Snapshot, now_ns: int | None = None) -> Any:
        """The snapshot as OTLP ``MetricsData`` (:func:`specobs.sinks._otlp_data.metrics_data`).

        Args:
            s: the snapshot to render.
            now_ns: the points' timestamp; default :meth:`now_ns`.

        Returns:
            An ``opentelemetry.sdk.metrics.export.MetricsData``.
        """
        return metrics_data(s, self.resource, self.now_ns() if now_ns is None else now_ns)

    def now_ns(self) -> int:
        """The time metric points are stamped with: the wall clock, but never behind the
        sink's anchor (wall and monotonic clock read together when the sink was made) plus the
        monotonic time since. After the wall clock is stepped back, points keep moving forward
        on the anchored timeline — the one spans are placed on — instead of going back before
        the series' start (``metrics_data`` clamps to the start as well)."""
        anchored = self._anchor_wall_ns + (_monotonic_ns() - self._anchor_monotonic_ns)
        return max(_wall_clock_ns(), anchored)

    def __repr__(self) -> str:
        signals = "+".join(
            n for n, on in (("traces", self.wants_traces), ("metrics", self.metrics)) if on
        )
        where = self.endpoint or "OTEL_EXPORTER_OTLP_ENDPOINT"
        return (
            f"<specobs.OtlpSink {signals} traces={self.traces_protocol} "
            f"metrics={self.metrics_protocol} endpoint={where}>"
        )
