"""One walk from a :class:`~specobs.Snapshot` to exported series, for every exporter.

``families(snapshot)`` yields each catalog metric in exposition order with its points: the label
values (in the order of the family's label names) and the value -- a number, a
:class:`~specobs.HistogramData`, or, for the info metric, 1 with the info labels as label names.
Optional gauges with no value yet are left out. The Prometheus and OTLP sinks only render what
this yields (as ``prometheus_client`` renders both text formats from one ``collect()`` stream), so
the two paths cannot disagree about which series exist or what they hold. The snapshot's constant
labels are not in the points: each exporter places them as its format wants.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from specobs import catalog
from specobs._model import CLOCKS, HistogramData, Snapshot

__all__ = ["Family", "Value", "families"]

Value = int | float | HistogramData


@dataclass(frozen=True)
class Family:
    """One metric's series: ``labels`` names the per-point labels, each point is
    ``(label values, value)``."""

    metric: catalog.Metric
    labels: tuple[str, ...]
    points: list[tuple[tuple[str, ...], Value]]


def families(s: Snapshot) -> Iterator[Family]:
    """Every family of the catalog, in ``catalog.CATALOG`` order (the exposition order)."""
    c = catalog
    yield Family(c.PHASE_DURATION, ("phase", "clock"), [
        ((phase, clock), s.phase_histograms[(phase, clock)])
        for phase in s.phases for clock in CLOCKS
    ])
    yield Family(c.CYCLE_DURATION, ("clock",),
                 [((clock,), s.cycle_histograms[clock]) for clock in CLOCKS])
    yield Family(c.CYCLES, (), [((), s.cycles_total)])
    yield Family(c.DRAFT_TOKENS, (), [((), s.draft_tokens_total)])
    yield Family(c.ACCEPTED_TOKENS, (), [((), s.accepted_tokens_total)])
    yield Family(c.EMITTED_TOKENS, (), [((), s.emitted_tokens_total)])
    yield Family(c.ACCEPT_LENGTH, (), [((), s.accept_length)])
    yield Family(c.ACCEPTED_BY_POSITION, ("position",),
                 [((str(i),), v) for i, v in enumerate(s.accepted_by_position)])
    yield Family(c.DRAFTED_BY_POSITION, ("position",),
                 [((str(i),), v) for i, v in enumerate(s.drafted_by_position)])
    yield Family(c.BATCH_SIZE, (), [((), s.batch_size)])
    yield Family(c.INFO, tuple(s.info), [(tuple(s.info.values()), 1)])
    optional: tuple[tuple[catalog.Metric, float | None], ...] = (
        (c.LAST_CYCLE_TIMESTAMP, s.last_cycle_timestamp_seconds),
        (c.BASELINE_SEQUENCE_TOKENS, s.baseline_tokens_per_second),
        (c.REQUESTS_RUNNING, s.requests_running),
        (c.REQUESTS_WAITING, s.requests_waiting),
    )
    for metric, current in optional:
        if current is not None:
            yield Family(metric, (), [((), current)])
    yield Family(c.DROPPED_RECORDS, ("reason",),
                 [((reason,), s.dropped.get(reason, 0)) for reason in c.DROP_REASONS])
    yield Family(c.SAMPLED_CYCLES, (), [((), s.sampled_cycles_total)])
    yield Family(c.SAMPLING_INTERVAL, (), [((), s.sampling_interval)])
    yield Family(c.OVERHEAD_RATIO, (), [((), float(s.overhead_ratio))])
    yield Family(c.EXPORTER_CPU, ("component",),
                 [((comp,), float(s.cpu_seconds[comp])) for comp in sorted(s.cpu_seconds)])
    if s.worker_thread_seconds:
        yield Family(c.WORKER_THREAD_TIME, ("state",),
                     [((state,), v) for state, v in s.worker_thread_seconds.items()])
    yield Family(c.ERRORS, ("kind",),
                 [((kind,), s.errors.get(kind, 0)) for kind in c.ERROR_KINDS])
