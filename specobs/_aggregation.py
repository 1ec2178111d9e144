"""The one aggregation every sink reads: fixed-bucket histograms, counters and gauges.

Only the resolver thread writes it, in batches, under ``lock``. Sinks read a consistent copy with
:meth:`Aggregation.snapshot`, so a Prometheus scrape and an OTLP export taken at the same moment
report the same numbers. Bucket boundaries and names come from :mod:`specobs.catalog`.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from specobs import catalog

__all__ = ["Aggregation", "Exemplar", "HistogramData", "Snapshot"]

CLOCKS: tuple[str, ...] = ("gpu", "host")


@dataclass(frozen=True)
class Exemplar:
    """A traced observation attached to one histogram bucket (OpenMetrics exemplar)."""

    value: float
    trace_id: str
    span_id: str
    timestamp_seconds: float


class _Histogram:
    __slots__ = ("bounds", "counts", "exemplars", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds: tuple[float, ...] = tuple(bounds)
        self.counts: list[int] = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.exemplars: list[Exemplar | None] = [None] * (len(self.bounds) + 1)

    def bucket(self, value: float) -> int:
        """Index of the bucket ``value`` falls in: the first bound >= value (Prometheus "le")."""
        return bisect_left(self.bounds, value)

    def observe_many(self, values: Sequence[float]) -> None:
        """Add a batch of values: sort once, then one bisect per bound instead of per value."""
        if not values:
            return
        vs = sorted(values)
        counts = self.counts
        prev = 0
        for i, bound in enumerate(self.bounds):
            n = bisect_right(vs, bound, prev)  # values <= bound, the same rule as bucket()
            counts[i] += n - prev
            prev = n
            if prev == len(vs):
                break
        counts[-1] += len(vs) - prev
        self.sum += sum(vs)

    def freeze(self) -> HistogramData:
        # Only counts and sum are kept; the total count is derived here.
        return HistogramData(
            self.bounds, tuple(self.counts), self.sum, sum(self.counts), tuple(self.exemplars)
        )


@dataclass(frozen=True)
class HistogramData:
    """A histogram read back: per-bucket (non-cumulative) counts, the +Inf bucket last."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int
    exemplars: tuple[Exemplar | None, ...] = ()

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, cumulative count)`` pairs as Prometheus exposes them, ``+Inf`` last."""
        out: list[tuple[float, int]] = []
        acc = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += n
            out.append((bound, acc))
        return out



@dataclass(frozen=True)
class Snapshot:
    """A consistent read of the aggregation. Tests and sinks read values from here."""

    phases: tuple[str, ...]
    max_draft_length: int
    labels: dict[str, str]
    info: dict[str, str]
    cycles_total: int
    draft_tokens_total: int
    accepted_tokens_total: int
    emitted_tokens_total: int
    sampled_cycles_total: int
    phase_histograms: dict[tuple[str, str], HistogramData]
    cycle_histograms: dict[str, HistogramData]
    accept_length: HistogramData
    drafted_by_position: tuple[int, ...]
    batch_size: HistogramData
    last_cycle_timestamp_seconds: float | None
    baseline_tokens_per_second: float | None
    requests_running: float | None
    requests_waiting: float | None
    dropped: dict[str, int]
    errors: dict[str, int]
    cpu_seconds: dict[str, float]
    sampling_interval: int
    overhead_ratio: float
    created_unix_seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def phase(self, phase: str, clock: str) -> HistogramData:
        """The ``specobs_phase_duration_seconds{phase, clock}`` histogram."""
        return self.phase_histograms[(phase, clock)]

    def phase_count(self, phase: str, clock: str) -> int:
        return self.phase_histograms[(phase, clock)].count

    def phase_seconds_sum(self, phase: str, clock: str) -> float:
        return self.phase_histograms[(phase, clock)].sum

    def cycle_count(self, clock: str) -> int:
        return self.cycle_histograms[clock].count

    def cycle_seconds_sum(self, clock: str) -> float:
        return self.cycle_histograms[clock].sum

    @property
    def accepted_by_position(self) -> tuple[int, ...]:
        """Accepted draft tokens at each draft position: sequences whose accept length > i.

        Derived exactly from the accept-length histogram, whose buckets are the integers 0..k+1.
        """
        counts = self.accept_length.counts
        out = []
        for i in range(self.max_draft_length):
            out.append(sum(counts[i + 1 : self.max_draft_length + 1]))
        return tuple(out)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens, or ``None`` before anything was drafted."""
        if self.draft_tokens_total == 0:
            return None
        return self.accepted_tokens_total / self.draft_tokens_total

    def dropped_total(self) -> int:
        return sum(self.dropped.values())


class Aggregation:
    """Histograms and counters for one observer; written by its resolver only."""

    def __init__(
        self,
        phases: Sequence[str],
        max_draft_length: int,
        labels: dict[str, str] | None = None,
        info: dict[str, str] | None = None,
        baseline_tokens_per_second: float | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self.phases = tuple(phases)
        self.max_draft_length = max_draft_length
        self.labels = dict(labels or {})
        self.info = dict(info or {})
        self.baseline_tokens_per_second = baseline_tokens_per_second
        buckets = catalog.DURATION_BUCKETS_SECONDS
        # Indexed [clock][phase index] so the resolver's inner loop does no dict lookups.
        self.phase_gpu = [_Histogram(buckets) for _ in self.phases]
        self.phase_host = [_Histogram(buckets) for _ in self.phases]
        self.cycle_gpu = _Histogram(buckets)
        self.cycle_host = _Histogram(buckets)
        self.accept_length = _Histogram(catalog.accept_length_buckets(max_draft_length))
        self.batch_size = _Histogram(catalog.BATCH_SIZE_BUCKETS)
        # Sequences by draft length k (0..max): drafted-by-position is derived from it.
        self.drafted_by_k = [0] * (max_draft_length + 1)
        self.cycles = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.emitted_tokens = 0
        self.sampled_cycles = 0
        self.last_cycle_timestamp: float | None = None
        self.requests_running: float | None = None
        self.requests_waiting: float | None = None
        self.dropped: dict[str, int] = dict.fromkeys(catalog.DROP_REASONS, 0)
        self.errors: dict[str, int] = dict.fromkeys(catalog.ERROR_KINDS, 0)
        self.cpu_seconds: dict[str, float] = {"hot_path": 0.0, "resolver": 0.0}
        self.sampling_interval = 1
        self.overhead_ratio = 0.0
        self.created_unix_seconds = time.time()
        #: Bumped under ``lock`` by every change the resolver applies: a sink may cache what it
        #: rendered from a snapshot until this moves (the Prometheus endpoint does).
        self.generation = 0

    def reset(self) -> None:
        """Start every total from zero with a new creation time (a forked child's own series:
        OpenMetrics ``_created`` and OTLP start times move, so consumers see a new series,
        not a counter going down). Labels, info, phases and the baseline stay."""
        fresh = Aggregation(self.phases, self.max_draft_length, self.labels, self.info,
                            self.baseline_tokens_per_second)
        generation = self.generation
        components = set(self.cpu_seconds)
        keep = {"lock", "labels", "info", "phases", "max_draft_length"}
        for name, value in vars(fresh).items():
            if name not in keep:
                setattr(self, name, value)
        self.cpu_seconds = dict.fromkeys(components, 0.0)
        self.generation = generation + 1

    def add_cpu(self, component: str, seconds: float) -> None:
        with self.lock:
            self.cpu_seconds[component] = self.cpu_seconds.get(component, 0.0) + seconds

    def snapshot(self) -> Snapshot:
        """Copy everything under the lock: O(buckets), a few microseconds."""
        with self.lock:
            phase_h: dict[tuple[str, str], HistogramData] = {}
            for i, p in enumerate(self.phases):
                phase_h[(p, "gpu")] = self.phase_gpu[i].freeze()
                phase_h[(p, "host")] = self.phase_host[i].freeze()
            return Snapshot(
                phases=self.phases,
                max_draft_length=self.max_draft_length,
                labels=dict(self.labels),
                info=dict(self.info),
                cycles_total=self.cycles,
                draft_tokens_total=self.draft_tokens,
                accepted_tokens_total=self.accepted_tokens,
                emitted_tokens_total=self.emitted_tokens,
                sampled_cycles_total=self.sampled_cycles,
                phase_histograms=phase_h,
                cycle_histograms={"gpu": self.cycle_gpu.freeze(), "host": self.cycle_host.freeze()},
                accept_length=self.accept_length.freeze(),
                drafted_by_position=tuple(
                    sum(self.drafted_by_k[j + 1 :]) for j in range(self.max_draft_length)
                ),
                batch_size=self.batch_size.freeze(),
                last_cycle_timestamp_seconds=self.last_cycle_timestamp,
                baseline_tokens_per_second=self.baseline_tokens_per_second,
                requests_running=self.requests_running,
                requests_waiting=self.requests_waiting,
                dropped=dict(self.dropped),
                errors=dict(self.errors),
                cpu_seconds=dict(self.cpu_seconds),
                sampling_interval=self.sampling_interval,
                overhead_ratio=self.overhead_ratio,
                created_unix_seconds=self.created_unix_seconds,
            )

