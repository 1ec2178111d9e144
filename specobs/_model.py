"""The data that crosses a thread or a layer: plain, frozen where it is read by others, stdlib only.

Every layer reads these types and none of them imports a layer, which is what keeps the import
graph one-way: the resolver builds :class:`ResolvedCycle` and the aggregation builds
:class:`Snapshot`; sinks, tools and the demo only read them (OpenTelemetry keeps its exported data
types in one ``point`` module for the same reason). Identifiers are integers and times are
integer nanoseconds from end to end; text and seconds are made only where a format needs them
(the Prometheus exposition), so nothing is converted twice or loses precision on the way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

__all__ = [
    "CLOCKS",
    "Acceptance",
    "BatchAcceptance",
    "CycleHandle",
    "Exemplar",
    "HistogramData",
    "ResolvedCycle",
    "Snapshot",
]

#: The two clocks every duration is measured on: CUDA events (sampled cycles) and the host's
#: ``perf_counter_ns`` (every cycle). The ``clock`` label's values, in exposition order.
CLOCKS: tuple[str, str] = ("gpu", "host")


def _unix_seconds(unix_nano: int) -> float:
    """Integer Unix nanoseconds as float seconds: the whole seconds added exactly, so the float
    is the one nearest the integer time (``unix_nano / 1e9`` rounds twice and can miss it)."""
    whole, nanos = divmod(unix_nano, 1_000_000_000)
    return whole + nanos / 1e9


class CycleHandle(Protocol):
    """What :meth:`Observer.begin` returns: a cycle in flight (or a no-op when recording is off).

    ``mark(phase)`` ends the running phase and starts the next, ``accept(...)`` records acceptance,
    ``end()`` ends the last phase; also a context manager that ends the cycle on exit.

    The calls' arguments are stated here once: the no-op handle (what ``begin`` returns before
    ``configure`` and after ``shutdown``) subclasses this protocol and keeps its bodies, which do
    nothing, so it refuses exactly the calls a recording handle refuses.
    """

    index: int

    def mark(self, phase: str, /) -> None:
        """End the running phase and start the next.

        Args:
            phase: the phase that starts now, one of the observer's ``phases`` after the first
                (a name out of order or unknown is counted as ``errors{kind="bad_phase"}``).
        """
        return None

    def accept(
        self,
        accepted: Any,
        *,
        draft_length: Any = None,
        batch_size: int | None = None,
        emitted: Any = None,
    ) -> None:
        """Record this cycle's acceptance; counted when the resolver takes the cycle.

        A value that cannot be read as counts is counted as ``errors{kind="bad_acceptance"}``
        and leaves this cycle without tokens (a bad ``emitted`` alone: the default is counted
        instead); the call itself never raises but for a call Python cannot bind (a
        ``TypeError``).

        Args:
            accepted: each sequence's accepted draft tokens, not counting the bonus token (a
                list, tuple, numpy array, CPU or CUDA tensor; a CUDA tensor is copied to the
                host asynchronously, never synchronized).
            draft_length: the tokens drafted for each sequence, an int or one per sequence
                (default: the observer's ``max_draft_length``).
            batch_size: the sequences in the batch (default: how many lengths ``accepted``
                holds).
            emitted: the tokens the cycle gave its requests, a count or one per sequence, at
                most 2**32 in all (default: accepted + 1 per sequence).
        """
        return None

    def end(self) -> None:
        """End the cycle's last phase (once; again: counted as ``end_without_begin``)."""
        return None

    def defer(self) -> CycleHandle:
        """End the cycle with its acceptance to come from :meth:`settle` (any thread); its
        times are final. Cycles that end after it wait for it (they are taken in order).
        Unsettled within ``settle_timeout_seconds``, or by the time a quarter of ``queue_size``
        (16 to 1,024, at most half of it) cycles wait behind it: counted with its times, without
        tokens (``dropped_records{reason="unsettled"}``), logged once."""
        ...

    def settle(
        self,
        accepted: Any,
        *,
        draft_length: Any = None,
        batch_size: int | None = None,
        emitted: Any = None,
    ) -> None:
        """A deferred cycle's acceptance, from any thread.

        Args:
            accepted: as :meth:`accept` takes it; ``None``: the cycle counts no tokens.
            draft_length: as :meth:`accept` takes it.
            batch_size: as :meth:`accept` takes it.
            emitted: as :meth:`accept` takes it.
        """
        return None

    def __enter__(self) -> CycleHandle: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        return None


@dataclass(frozen=True)
class Exemplar:
    """A traced observation attached to one histogram bucket (an OpenMetrics / OTLP exemplar).

    ``value`` is the observed duration in seconds (the same float the histogram counted); the
    ids are the traced cycle's span ids as integers; ``time_unix_nano`` is when the cycle ended.
    On the per-request acceptance histogram: the request's acceptance rate, its trace id, no
    span id (``None``), and when the engine reported it finished.
    """

    value: float
    trace_id: int
    span_id: int | None
    time_unix_nano: int

    @property
    def timestamp_seconds(self) -> float:
        """Unix seconds, the float nearest the integer time (see :func:`_unix_seconds`)."""
        return _unix_seconds(self.time_unix_nano)


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
    """A consistent read of one observer's aggregation. Tests, tools and sinks read it."""

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
    #: When the cumulative series started (the observer's creation, or a forked child's restart):
    #: OpenMetrics ``_created`` and the OTLP start time.
    created_unix_nano: int = 0
    #: Seconds the recording thread ran on a CPU and waited for one, by state (``running``,
    #: ``waiting``): empty where the kernel does not say (``specobs_worker_thread_time``).
    worker_thread_seconds: dict[str, float] = field(default_factory=dict)
    #: The adaptive sampler's overhead budget, a fraction of cycle time
    #: (``specobs_exporter_sampling_budget_ratio``); ``None`` when the interval is fixed.
    sampling_budget_ratio: float | None = None
    #: Finished requests' acceptance rates (``specobs_request_acceptance``) and every finished
    #: request reported (``specobs_requests_finished_total``); ``None`` until the engine reports
    #: one (:meth:`Observer.request_finished`).
    request_acceptance: HistogramData | None = None
    #: Draft tokens the engine left out of verification (``specobs_draft_tokens_unverified_total``;
    #: ``None`` until it reports some, :meth:`Observer.drafts_unverified`).
    draft_tokens_unverified: int | None = None
    requests_finished_total: int | None = None

    #: Cycles by the draft length in effect (``specobs_cycles_by_draft_length_total``): the k
    #: ``begin(draft_length=)`` named, else the one the acceptance named; only the lengths seen.
    #: The ``specobs_draft_length`` histogram is made of it (:attr:`draft_length`).
    cycles_by_draft_length: dict[int, int] = field(default_factory=dict)
    #: Host-clock seconds of each phase (in ``phases`` order) of those cycles, by draft length.
    phase_seconds_by_draft_length: dict[int, tuple[float, ...]] = field(default_factory=dict)
    #: Tokens those cycles emitted, by the cycle's draft length.
    emitted_by_draft_length: dict[int, int] = field(default_factory=dict)
    #: Accepted draft tokens and sequences by each sequence's own draft length (the drafts it
    #: verified): acceptance at k is ``accepted[k] / (k * sequences[k])``.
    accepted_by_draft_length: dict[int, int] = field(default_factory=dict)
    sequences_by_draft_length: dict[int, int] = field(default_factory=dict)
    #: Who measured ``baseline_tokens_per_second``: ``None`` when configured, else the
    #: ``source`` label (``catalog.BASELINE_SOURCE_PLAIN_STEPS``).
    baseline_source: str | None = None
    #: Sequences of the cycles of each draft length in effect, by the cycle's k (their batch
    #: sizes summed; ``specobs_sequences_by_draft_length_total``): over
    #: ``cycles_by_draft_length``, the mean batch at k. Keyed as ``cycles_by_draft_length``.
    batch_by_draft_length: dict[int, int] = field(default_factory=dict)
    #: Host-clock gaps between two cycles of one thread (``specobs_cycle_gap_seconds``), and the
    #: gaps longer than ``Settings.idle_gap_seconds`` counted instead
    #: (``specobs_cycle_idle_gaps_total``). Both are required series: a snapshot made without
    #: them (``None``) cannot be exported.
    cycle_gap: HistogramData | None = None
    idle_gaps_total: int | None = None

    @property
    def draft_length(self) -> HistogramData:
        """The ``specobs_draft_length`` histogram: one bucket per value 0..max_draft_length
        (then +Inf, always empty), made of :attr:`cycles_by_draft_length`."""
        k = self.max_draft_length
        by_k = self.cycles_by_draft_length
        counts = (*(by_k.get(i, 0) for i in range(k + 1)), 0)
        return HistogramData(tuple(float(i) for i in range(k + 1)), counts,
                             float(sum(i * n for i, n in by_k.items())), sum(counts))

    @property
    def drafted_by_draft_length(self) -> dict[int, int]:
        """Draft tokens verified by each sequence's own draft length: k times its sequences."""
        return {k: k * n for k, n in self.sequences_by_draft_length.items()}

    @property
    def created_unix_seconds(self) -> float:
        return _unix_seconds(self.created_unix_nano)

    def phase(self, phase: str, clock: str) -> HistogramData:
        """The ``specobs_phase_duration_seconds{phase, clock}`` histogram.

        Args:
            phase: a phase of :attr:`phases`.
            clock: ``"host"`` or ``"gpu"``.

        Returns:
            The histogram; ``KeyError`` for a phase or clock the observer does not record.
        """
        return self.phase_histograms[(phase, clock)]

    def phase_count(self, phase: str, clock: str) -> int:
        """Cycles counted in one phase's histogram.

        Args:
            phase: a phase of :attr:`phases`.
            clock: ``"host"`` or ``"gpu"``.

        Returns:
            The histogram's count.
        """
        return self.phase_histograms[(phase, clock)].count

    def phase_seconds_sum(self, phase: str, clock: str) -> float:
        """Seconds summed in one phase's histogram.

        Args:
            phase: a phase of :attr:`phases`.
            clock: ``"host"`` or ``"gpu"``.

        Returns:
            The histogram's sum in seconds.
        """
        return self.phase_histograms[(phase, clock)].sum

    def cycle_count(self, clock: str) -> int:
        """Cycles counted in the whole-cycle histogram of one clock.

        Args:
            clock: ``"host"`` or ``"gpu"``.

        Returns:
            The ``specobs_cycle_duration_seconds{clock}`` histogram's count.
        """
        return self.cycle_histograms[clock].count

    def cycle_seconds_sum(self, clock: str) -> float:
        """Seconds summed in the whole-cycle histogram of one clock.

        Args:
            clock: ``"host"`` or ``"gpu"``.

        Returns:
            The ``specobs_cycle_duration_seconds{clock}`` histogram's sum in seconds.
        """
        return self.cycle_histograms[clock].sum

    @property
    def accepted_by_position(self) -> tuple[int, ...]:
        """Accepted draft tokens at each draft position: sequences whose accept length > i.

        Derived exactly from the accept-length histogram, whose buckets are the integers 0..k+1.
        """
        counts = self.accept_length.counts
        k = self.max_draft_length
        return tuple(sum(counts[i + 1 : k + 1]) for i in range(k))

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens, or ``None`` before anything was drafted."""
        if self.draft_tokens_total == 0:
            return None
        return self.accepted_tokens_total / self.draft_tokens_total

    def dropped_total(self) -> int:
        return sum(self.dropped.values())


class Acceptance(NamedTuple):
    """One cycle's validated acceptance.

    ``shape`` is the draft length of each sequence, or ``(k, sequences)`` when every sequence
    drafted ``k`` tokens (the common case, kept compact).
    """

    lengths: list[int]
    accepted: int
    drafted: int
    emitted: int
    shape: list[int] | tuple[int, int]


class BatchAcceptance(NamedTuple):
    """A chunk's validated acceptance: what the aggregation adds.

    ``length_counts[v]`` is how many sequences accepted ``v`` tokens (0..max_draft_length);
    ``sequences_by_draft_length`` counts sequences per draft length (drafted-by-position is
    derived from it); ``accepted_by_draft_length`` their accepted tokens, by the same key.
    """

    length_counts: list[int]
    accepted: int
    drafted: int
    emitted: int
    sequences_by_draft_length: dict[int, int]
    accepted_by_draft_length: dict[int, int]


@dataclass(frozen=True, slots=True, repr=False)
class ResolvedCycle:
    """A cycle after resolution: durations in nanoseconds, counts, and trace ids if traced.
    The resolver makes it whole; sinks read it."""

    index: int
    phases: tuple[str, ...]
    start_wall_ns: int
    end_wall_ns: int
    #: Host-clock duration of each phase.
    host_ns: list[int]
    #: GPU-clock duration of each phase (sampled cycles), else ``None``.
    gpu_ns: list[int] | None = None
    batch_size: int | None = None
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    #: Each sequence's accepted draft tokens, when the cycle gave valid acceptance.
    accept_lengths: list[int] | None = None
    #: Per-sequence draft lengths, or (k, sequences) when every sequence drafted k.
    drafted_shape: list[int] | tuple[int, int] | None = None
    trace_id: int | None = None
    span_id: int | None = None
    phase_span_ids: list[int] | None = None

    @property
    def host_cycle_ns(self) -> int:
        return sum(self.host_ns)

    @property
    def gpu_cycle_ns(self) -> int | None:
        return None if self.gpu_ns is None else sum(self.gpu_ns)

    def __repr__(self) -> str:
        return (
            f"ResolvedCycle(index={self.index}, host_ns={self.host_ns}, gpu_ns={self.gpu_ns}, "
            f"batch_size={self.batch_size}, drafted={self.drafted}, accepted={self.accepted})"
        )
