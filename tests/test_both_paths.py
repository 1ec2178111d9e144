"""Scrape and push see the same numbers under the same names.

One observer with a PrometheusSink and an OtlpSink (to a real OTLP receiver). Every OTLP data point
is translated to the Prometheus series a Collector's Prometheus exporter would produce (the
catalog's derived name, ``_bucket``/``_sum``/``_count`` with cumulative ``le``, ``_total``), and
compared with the scraped exposition, series by series and value by value.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import specobs
from specobs import catalog
from specobs.timing import FakeEventClock, FakeGpu
from tests._otlp_receiver import OtlpReceiver, attributes_to_dict

NEVER = 3600.0


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def otlp_series(receiver: OtlpReceiver) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The last exported value of every series, named as a Collector would name it."""
    latest: dict[str, Any] = {}
    for _resource, metric in receiver.metrics():
        latest[metric.name] = metric
    by_otel = {m.otel_name: m for m in catalog.CATALOG}
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for otel_name, metric in latest.items():
        m = by_otel[otel_name]
        kind = metric.WhichOneof("data")
        if kind == "histogram":
            for p in metric.histogram.data_points:
                attrs = {k: str(v) for k, v in attributes_to_dict(p.attributes).items()}
                acc = 0
                for bound, n in zip((*p.explicit_bounds, math.inf), p.bucket_counts, strict=True):
                    acc += n
                    key = frozenset({**attrs, "le": _le(bound)}.items())
                    out[(f"{m.name}_bucket", key)] = float(acc)
                out[(f"{m.name}_sum", frozenset(attrs.items()))] = p.sum
                out[(f"{m.name}_count", frozenset(attrs.items()))] = float(p.count)
        else:
            points = metric.sum.data_points if kind == "sum" else metric.gauge.data_points
            for p in points:
                attrs = {k: str(v) for k, v in attributes_to_dict(p.attributes).items()}
                value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
                out[(m.name, frozenset(attrs.items()))] = value
    return out


def scraped_series(
    registry: CollectorRegistry,
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return out


def test_every_catalog_series_has_the_same_value_scraped_and_pushed(otlp_receiver: OtlpReceiver):
    registry = CollectorRegistry()
    gpu = FakeGpu()
    otlp = specobs.OtlpSink(endpoint=otlp_receiver.grpc_endpoint, protocol="grpc",
                            export_interval_seconds=NEVER)
    obs = specobs.configure(
        sinks=[specobs.PrometheusSink(registry=registry), otlp],
        clock=FakeEventClock(gpu, pool_size=1024), sample_every=2, max_draft_length=4,
        labels={"model": "m", "engine": "e"}, baseline_tokens_per_second=25.0,
        poll_interval_seconds=NEVER,
    )
    obs.set_requests(running=2, waiting=1)
    obs.request_finished(drafted=12, accepted=5)
    obs.request_finished(drafted=9, accepted=1, trace_id=0x5B8EFFF798038103D269B633813FC60C)
    obs.request_finished(drafted=0, accepted=0)
    obs.drafts_unverified(7)
    for i in range(60):
        with obs.cycle(batch_size=1 + i % 3) as c:
            gpu.run(30_000 + 1000 * i)
            c.mark("verify")
            gpu.run(400_000)
            c.mark("bookkeeping")
            gpu.run(5_000)
            c.accept([i % 5 for _ in range(1 + i % 3)], draft_length=4)
        gpu.complete()
    obs.mark("verify")  # one misuse, so an error counter is non-zero too
    assert obs.force_flush(timeout_seconds=10)

    pushed = otlp_series(otlp_receiver)
    scraped = scraped_series(registry)
    obs.shutdown()

    # The exporters' own CPU time and the recording thread's times move with every scrape and
    # export: compare presence only.
    moving = {catalog.EXPORTER_CPU.name, catalog.WORKER_THREAD_TIME.name}
    assert {k for k in pushed if k[0] not in moving} == {k for k in scraped if k[0] not in moving}
    assert {k for k in pushed if k[0] in moving} == {k for k in scraped if k[0] in moving}
    for key, value in scraped.items():
        if key[0] in moving:
            continue
        assert pushed[key] == value, key
    # Every catalog series is there, on both paths, and the interesting ones are not zero (but
    # the sampling budget: sample_every=2 is a fixed interval, which no budget steers).
    names = {k[0] for k in scraped}
    for m in catalog.CATALOG:
        if m is catalog.SAMPLING_BUDGET:
            assert m.name not in names
            continue
        for series in m.series():
            assert series in names, series
    for series in ("specobs_cycles_total", "specobs_accepted_tokens_total",
                   "specobs_exporter_sampled_cycles_total", "specobs_exporter_errors_total"):
        assert sum(v for (n, _), v in scraped.items() if n == series) > 0, series
    assert scraped[("specobs_cycles_total", frozenset({"model": "m", "engine": "e"}.items()))] == 60
