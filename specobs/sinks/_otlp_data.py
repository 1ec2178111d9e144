"""Snapshots and resolved cycles as the OpenTelemetry SDK's export data: pure functions.

:func:`metrics_data` renders :func:`specobs._series.families` (the walk the Prometheus sink
renders too) as ``MetricsData``: histograms with the catalog's explicit bounds and the
aggregation's exemplars, counters as monotonic cumulative ``Sum`` points starting at the
snapshot's creation time, gauges as ``Gauge`` points, the info metric as a gauge of 1 whose
attributes are the info labels. Constant labels are point attributes, first.
:func:`cycle_spans` builds one traced cycle's spans as SDK ``ReadableSpan`` objects directly (no
tracer, no context: the SDK's per-span path costs several times more; benchmarks/RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import specobs._series as _series
from specobs._errors import require
from specobs._model import HistogramData, ResolvedCycle, Snapshot
from specobs._version import __version__
from specobs.catalog import CYCLE_SPAN_NAME

require("opentelemetry.sdk", feature="OTLP export", extra="otlp")

from opentelemetry.sdk.metrics import Exemplar as OtelExemplar  # noqa: E402
from opentelemetry.sdk.metrics.export import (  # noqa: E402
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags  # noqa: E402

__all__ = ["SCOPE", "cycle_spans", "metrics_data"]

SCOPE = InstrumentationScope("specobs", __version__)
# OTLP's histogram min/max are optional; the aggregation does not track them, so they are left
# unset (the protobuf encoder treats None as "not present").
_UNSET = cast(float, None)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_CUMULATIVE = AggregationTemporality.CUMULATIVE


def metrics_data(s: Snapshot, resource: Resource, now_ns: int) -> MetricsData:
    """The snapshot as OTLP metrics data: every family :func:`specobs._series.families` yields.

    Every point's time is at least its start time: a ``now_ns`` before the start (the wall
    clock stepped back past the observer's creation) is clamped to the start, so receivers
    never see ``time_unix_nano < start_time_unix_nano``.
    """
    start = s.created_unix_nano or now_ns
    now_ns = max(now_ns, start)
    const = dict(s.labels)
    out: list[Metric] = []
    for fam in _series.families(s):
        m = fam.metric
        points = [({**const, **dict(zip(fam.labels, values, strict=True))}, v)
                  for values, v in fam.points]
        data: Any
        if m.kind == "histogram":
            data = Histogram(
                [_hist_point(cast(HistogramData, v), a, start, now_ns) for a, v in points],
                _CUMULATIVE,
            )
        elif m.kind == "counter":
            data = Sum(
                [NumberDataPoint(a, start, now_ns, cast("int | float", v)) for a, v in points],
                _CUMULATIVE,
                True,
            )
        else:  # gauges, and the info metric as a gauge of 1
            data = Gauge(
                [NumberDataPoint(a, start, now_ns, cast("int | float", v)) for a, v in points],
            )
        out.append(Metric(m.otel_name, m.help, m.unit, data))
    return MetricsData([ResourceMetrics(resource, [ScopeMetrics(SCOPE, out, "")], "")])


def _hist_point(
    h: HistogramData, attrs: dict[str, str], start: int, now: int
) -> HistogramDataPoint:
    # A request's exemplar has no span id; the SDK's encoder drops the trace id of an exemplar
    # without one, so it gets span id 0: all-zero bytes, which receivers read as no span (the
    # Collector's Prometheus exporter then writes the trace_id label alone).
    exemplars = [
        OtelExemplar(None, e.value, e.time_unix_nano, span_id=e.span_id or 0, trace_id=e.trace_id)
        for e in h.exemplars
        if e is not None
    ]
    return HistogramDataPoint(
        attributes=attrs,
        start_time_unix_nano=start,
        time_unix_nano=now,
        count=h.count,
        sum=h.sum,
        bucket_counts=list(h.counts),
        explicit_bounds=list(h.bounds),
        min=_UNSET,
        max=_UNSET,
        exemplars=exemplars,
    )


def cycle_spans(
    r: ResolvedCycle, resource: Resource, extra: Mapping[str, Any] | None = None
) -> list[ReadableSpan]:
    """A traced cycle as one ``specobs.cycle`` span and a child span per phase.

    The children follow back to back from the cycle's wall-clock start, each lasting its GPU
    duration when the cycle was GPU-timed (``specobs.clock = "gpu"``), else its host duration.
    ``extra``: attributes the cycle span carries before its own (the GenAI ones).
    """
    trace_id = r.trace_id
    assert trace_id is not None and r.span_id is not None
    host = r.host_ns
    durations = r.gpu_ns if r.gpu_ns is not None and len(r.gpu_ns) == len(host) else None
    clock = "gpu" if durations is not None else "host"
    if durations is None:
        durations = host
    parent_ctx = SpanContext(trace_id, r.span_id, is_remote=False, trace_flags=_SAMPLED)
    start = r.start_wall_ns
    attrs: dict[str, Any] = {
        **(extra or {}),
        "specobs.cycle.index": r.index,
        "specobs.clock": clock,
        "specobs.host_duration_ns": sum(host),
    }
    if r.batch_size is not None:
        attrs["specobs.batch_size"] = r.batch_size
    if r.accept_lengths is not None:
        attrs["specobs.draft_tokens"] = r.drafted
        attrs["specobs.accepted_tokens"] = r.accepted
        attrs["specobs.emitted_tokens"] = r.emitted
    out: list[ReadableSpan] = []
    ids = r.phase_span_ids
    t = start
    for i, phase in enumerate(r.phases[: len(durations)]):
        end = t + durations[i]
        child_id = ids[i] if ids is not None and i < len(ids) else (r.span_id ^ (i + 1)) or 1
        out.append(
            ReadableSpan(
                name=phase,
                context=SpanContext(trace_id, child_id, is_remote=False, trace_flags=_SAMPLED),
                parent=parent_ctx,
                resource=resource,
                attributes={
                    "specobs.clock": clock,
                    "specobs.cycle.index": r.index,
                    "specobs.host_duration_ns": host[i],
                },
                kind=SpanKind.INTERNAL,
                start_time=t,
                end_time=end,
                instrumentation_scope=SCOPE,
            )
        )
        t = end
    parent = ReadableSpan(
        name=CYCLE_SPAN_NAME,
        context=parent_ctx,
        parent=None,
        resource=resource,
        attributes=attrs,
        kind=SpanKind.INTERNAL,
        start_time=start,
        end_time=t,
        instrumentation_scope=SCOPE,
    )
    return [parent, *out]
