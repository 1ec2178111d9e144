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

import specobs.catalog as catalog
from specobs._model import CLOCKS, HistogramData, Snapshot

__all__ = ["Family", "Value", "families", "le_text"]

Value = int | float | HistogramData


@dataclass(frozen=True)
class Family:
    """One metric's series: ``labels`` names the per-point labels, each point is
    ``(label values, value)``."""

    metric: catalog.Metric
    labels: tuple[str, ...]
    points: list[tuple[tuple[str, ...], Value]]


def families(s: Snapshot) -> Iterator[Family]:
    """Every family of the catalog, in ``catalog.CATALOG`` order (the exposition order). Label
    names are the catalog's (the info metric's are the snapshot's info keys); a
    :attr:`catalog.Metric.optional` metric without a value yet is left out."""
    c = catalog
    walk: tuple[tuple[catalog.Metric, list[tuple[tuple[str, ...], Value]] | None], ...] = (
        (c.PHASE_DURATION, [((phase, clock), s.phase_histograms[(phase, clock)])
                            for phase in s.phases for clock in CLOCKS]),
        (c.CYCLE_DURATION, [((clock,), s.cycle_histograms[clock]) for clock in CLOCKS]),
        (c.CYCLE_GAP, _one(s.cycle_gap)),
        (c.IDLE_GAPS, _one(s.idle_gaps_total)),
        (c.CYCLES, _one(s.cycles_total)),
        (c.DRAFT_TOKENS, _one(s.draft_tokens_total)),
        (c.DRAFT_TOKENS_UNVERIFIED, _one(s.draft_tokens_unverified)),
        (c.ACCEPTED_TOKENS, _one(s.accepted_tokens_total)),
        (c.EMITTED_TOKENS, _one(s.emitted_tokens_total)),
        (c.ACCEPT_LENGTH, _one(s.accept_length)),
        (c.ACCEPTED_BY_POSITION, [((str(i),), v) for i, v in enumerate(s.accepted_by_position)]),
        (c.DRAFTED_BY_POSITION, [((str(i),), v) for i, v in enumerate(s.drafted_by_position)]),
        (c.DRAFT_LENGTH, _one(s.draft_length)),
        (c.CYCLES_BY_DRAFT_LENGTH, _by_k(s.cycles_by_draft_length)),
        (c.PHASE_TIME_BY_DRAFT_LENGTH, [((phase, str(k)), seconds[i])
                                        for k, seconds in s.phase_seconds_by_draft_length.items()
                                        for i, phase in enumerate(s.phases)] or None),
        (c.EMITTED_BY_DRAFT_LENGTH, _by_k(s.emitted_by_draft_length)),
        (c.SEQUENCES_BY_DRAFT_LENGTH, _by_k(s.batch_by_draft_length)),
        (c.ACCEPTED_BY_DRAFT_LENGTH, _by_k(s.accepted_by_draft_length)),
        (c.DRAFTED_BY_DRAFT_LENGTH, _by_k(s.drafted_by_draft_length)),
        (c.BATCH_SIZE, _one(s.batch_size)),
        (c.INFO, [(tuple(s.info.values()), 1)]),
        (c.LAST_CYCLE_TIMESTAMP, _one(s.last_cycle_timestamp_seconds)),
        (c.BASELINE_SEQUENCE_TOKENS, _baseline(s)),
        (c.REQUESTS_RUNNING, _one(s.requests_running)),
        (c.REQUESTS_WAITING, _one(s.requests_waiting)),
        (c.REQUEST_ACCEPTANCE, _one(s.request_acceptance)),
        (c.REQUESTS_FINISHED, _one(s.requests_finished_total)),
        (c.DROPPED_RECORDS, [((reason,), s.dropped.get(reason, 0)) for reason in c.DROP_REASONS]),
        (c.SAMPLED_CYCLES, _one(s.sampled_cycles_total)),
        (c.SAMPLING_INTERVAL, _one(s.sampling_interval)),
        (c.SAMPLING_BUDGET, _one(s.sampling_budget_ratio)),
        (c.OVERHEAD_RATIO, _one(float(s.overhead_ratio))),
        (c.EXPORTER_CPU, [((comp,), float(s.cpu_seconds[comp])) for comp in sorted(s.cpu_seconds)]),
        (c.WORKER_THREAD_TIME, [((state,), v) for state, v in s.worker_thread_seconds.items()]
         or None),
        (c.ERRORS, [((kind,), s.errors.get(kind, 0)) for kind in c.ERROR_KINDS]),
    )
    for metric, points in walk:
        if points is None:
            if not metric.optional:
                raise ValueError(f"{metric.name} has no value, and only an optional metric may "
                                 "be left out (catalog.Metric.optional)")
            continue
        labels = metric.labels
        if metric is c.INFO:
            labels = tuple(s.info)
        elif metric is c.BASELINE_SEQUENCE_TOKENS and s.baseline_source is not None:
            labels = ("source",)  # measured; a configured baseline has no source label
        yield Family(metric, labels, points)


def le_text(bound: float) -> str:
    """A bucket's ``le`` label value as Prometheus writes it (``0.005``, ``1.0``, ``+Inf``): the
    one formatter of the exposition and of the tools reading snapshots in-process."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _by_k(by_k: dict[int, int]) -> list[tuple[tuple[str, ...], Value]] | None:
    """A counter by draft length: label ``draft_length`` the decimal k, the lengths seen only
    (``None``, left out, before any cycle had a k)."""
    return [((str(k),), v) for k, v in by_k.items()] or None


def _baseline(s: Snapshot) -> list[tuple[tuple[str, ...], Value]] | None:
    """The baseline gauge: configured (no label), or measured (label ``source``)."""
    v = s.baseline_tokens_per_second
    if v is None or s.baseline_source is None:
        return _one(v)
    return [((s.baseline_source,), v)]


def _one(value: Value | None) -> list[tuple[tuple[str, ...], Value]] | None:
    """The one point of a metric without labels, or ``None`` for no value yet."""
    return None if value is None else [((), value)]
