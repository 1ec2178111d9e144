"""The one aggregation every sink reads: fixed-bucket histograms, counters and gauges.

Only this class writes its state, under its own lock, through its methods: the resolver applies a
validated chunk (:meth:`Aggregation.apply`) and the sampling figures; sinks count their CPU and
their losses (:meth:`add_cpu`, :meth:`count_dropped`); the observer sets the request gauges. It is
the :class:`~specobs.sinks.MetricSource` sinks are given. Readers take a consistent copy with
:meth:`Aggregation.snapshot`, so a Prometheus scrape and an OTLP export taken at the same moment
report the same numbers. Bucket boundaries and names come from :mod:`specobs.catalog`.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import add
from typing import TYPE_CHECKING, Any

import specobs.catalog as catalog
from specobs._bucketing import Bucketed
from specobs._model import BatchAcceptance, Exemplar, HistogramData, Snapshot
from specobs._ring_results import ByDraftLength, RingTotals, add_counts, add_ns_by_k
from specobs._signalsafe import GuardedLock
from specobs._threadtime import WorkerThreadTime

if TYPE_CHECKING:
    from specobs._model import ResolvedCycle

__all__ = ["Aggregation", "Chunk"]

_log = logging.getLogger("specobs")


@dataclass(frozen=True, slots=True)
class Chunk:
    """What the resolver hands the aggregation for one chunk of cycles: validated numbers only,
    so applying it cannot fail on input, and it is applied whole. Only what needed Python is in
    it -- the sampled cycles' GPU times, the acceptance and batch sizes of cycles whose values
    were kept as objects, traced cycles, the recorder's drops and errors since the last chunk;
    every cycle's host times, and the acceptance and batch sizes the ring counted itself, are in
    the ring's running totals, which the snapshot reads."""

    #: Records lost by reason, and errors by kind, since the last chunk.
    dropped: dict[str, int]
    errors: dict[str, int]
    #: GPU phase durations, bucketed (ns sums), per phase, and the whole cycle's.
    gpu_phases: list[Bucketed]
    gpu_cycle: Bucketed | None
    #: Drafted / accepted / emitted tokens, sequences by draft length, and sequences by
    #: accepted length (0..k).
    acceptance: BatchAcceptance | None
    batch_sizes: Bucketed | None
    #: Cycles with a trace id: their exemplars.
    traced: list[ResolvedCycle]
    #: The cycles only Python could place under their draft length (begin's value validated
    #: here, or derived from acceptance validated here), and the emitted tokens and batch sizes
    #: of cycles the ring placed whose acceptance or batch size was validated here: ({k: cycles},
    #: {k: host ns per phase}, {k: emitted}, {}, {k: sequences}) -- accepted tokens by each
    #: sequence's draft length are in ``acceptance``.
    by_draft_length: ByDraftLength | None = None


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

    def add(self, bucketed: Bucketed, scale: float) -> None:
        """Add a chunk bucketed by :mod:`specobs._bucketing`: counts per bucket (the same
        bounds) and the raw sum, scaled here."""
        counts, total = bucketed
        self.counts = list(map(add, self.counts, counts))
        self.sum += total * scale

    def freeze(self, extra: Bucketed | None = None, scale: float = 1e-9) -> HistogramData:
        """A copy; ``extra`` (counts on the same bounds, and a raw sum) is added in: the ring's
        running totals. Only counts and sum are kept; the total count is derived here."""
        counts = self.counts
        total = self.sum
        if extra is not None:
            ec, es = extra
            counts = [a + b for a, b in zip(counts, ec, strict=False)] + counts[len(ec):]
            total += es * scale
        return HistogramData(self.bounds, tuple(counts), total, sum(counts), tuple(self.exemplars))


class _RequestAcceptance:
    """Finished requests' acceptance rates: a histogram on the catalog's bounds, the count of
    requests reported, and the latest traced request in each of the lowest buckets (the worst
    requests, at most one exemplar a bucket). Requests finish a thousand times less often than
    cycles, so they skip the ring: the engine's call writes here directly, under a lock of this
    accumulator's own (a scrape's snapshot holding the aggregation's lock never makes the
    engine wait for more than this copy)."""

    __slots__ = ("bounds", "changes", "counts", "exemplar_buckets", "exemplars", "finished",
                 "lock", "pending", "sum")

    def __init__(self, changes: int = 0) -> None:
        self.lock = GuardedLock()  # a signal handler's request waits for no frame below it
        #: Requests a signal handler reported while its thread held the lock: added next time.
        self.pending: list[tuple[int, float, Exemplar | None]] = []
        self.bounds: tuple[float, ...] = catalog.REQUEST_ACCEPTANCE_BUCKETS
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.exemplars: list[Exemplar | None] = [None] * (len(self.bounds) + 1)
        #: Buckets below this index keep exemplars (upper bound <= the catalog's maximum).
        self.exemplar_buckets = bisect_right(self.bounds, catalog.REQUEST_ACCEPTANCE_EXEMPLAR_MAX)
        self.finished = 0
        #: Moves with every request (part of :attr:`Aggregation.generation`); never goes back,
        #: not even after fork, so a cached rendering is never taken for a later one.
        self.changes = changes

    def observe(self, drafted: int, accepted: int, trace_id: int | None) -> None:
        rate, i, ex = 0.0, 0, None
        if drafted:
            rate = accepted / drafted
            i = bisect_left(self.bounds, rate)
            if trace_id is not None and i < self.exemplar_buckets:
                ex = Exemplar(rate, trace_id, None, time.time_ns())
        one = (i if drafted else -1, rate, ex)
        if not self.lock.acquire():
            self.pending.append(one)
            return
        try:
            self._add(one)
            while self.pending:
                self._add(self.pending.pop(0))
        finally:
            self.lock.release()

    def _add(self, one: tuple[int, float, Exemplar | None]) -> None:
        i, rate, ex = one
        self.finished += 1
        if i >= 0:
            self.counts[i] += 1
            self.sum += rate
            if ex is not None:
                self.exemplars[i] = ex
        self.changes += 1

    def freeze(self) -> tuple[HistogramData | None, int | None]:
        """The histogram and the requests reported, or ``(None, None)`` before the first (read
        as it stands by a signal handler that interrupted this thread inside the lock)."""
        locked = self.lock.acquire()
        try:
            while locked and self.pending:
                self._add(self.pending.pop(0))
            if not self.finished:
                return None, None
            counts = tuple(self.counts)
            return (HistogramData(self.bounds, counts, self.sum, sum(counts),
                                  tuple(self.exemplars)), self.finished)
        finally:
            if locked:
                self.lock.release()


def _exportable_labels(values: dict[str, Any], max_length: int) -> tuple[dict[str, str], list[str]]:
    """``values`` with each value made to keep the label rule, and the names of those changed
    (each with a bounded view of its value)."""
    out: dict[str, str] = {}
    changed: list[str] = []
    for key, value in values.items():
        text = str(value)
        if catalog.label_value_problem(text, max_length) is not None:
            changed.append(f"{key}={text[:40]!a}")
            text = catalog.exportable_label_value(text, max_length)
        out[key] = text
    return out, changed


class Aggregation:
    """Histograms and counters for one observer. Every write goes through a method, under
    ``_lock``; nothing outside this class touches its state.

    The lock is a :class:`~specobs._signalsafe.GuardedLock`: a signal handler that interrupted
    a thread inside it (and calls ``force_flush``, ``shutdown``, ``set_requests`` ...) never
    waits for itself. Its counts and gauges are kept and applied at the next write or
    snapshot that takes the lock, and its snapshot reads the aggregation as it stands.
    """

    def __init__(
        self,
        phases: Sequence[str],
        max_draft_length: int,
        labels: dict[str, str] | None = None,
        info: dict[str, str] | None = None,
        baseline_tokens_per_second: float | None = None,
        created_unix_nano: int | None = None,
        sampling_budget_ratio: float | None = None,
        max_label_value_length: int = catalog.DEFAULT_MAX_LABEL_VALUE_LENGTH,
    ) -> None:
        self._lock = GuardedLock()
        #: Writes made while this thread held the lock (a signal handler's): applied later.
        self._deferred: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self.phases = tuple(phases)
        self.max_draft_length = max_draft_length
        # Label values that break the label rule (catalog.label_value_problem) would fail
        # every scrape: ``configure()`` refuses such constant labels; what reaches here
        # otherwise (a custom clock's name in ``info``) is made to fit and counted below.
        self.labels, bad = _exportable_labels(labels or {}, max_label_value_length)
        self.info, bad_info = _exportable_labels(info or {}, max_label_value_length)
        bad += bad_info
        self.baseline_tokens_per_second = baseline_tokens_per_second
        #: The adaptive sampler's overhead budget (configured, so set once here beside the
        #: interval it steers; None when the interval is fixed).
        self.sampling_budget_ratio = sampling_budget_ratio
        self._zero(time.time_ns() if created_unix_nano is None else created_unix_nano,
                   ("hot_path", "resolver"))
        if bad:
            self.errors["bad_label"] += len(bad)
            _log.warning("specobs: label values %s cannot be exported as given; their control "
                         "characters are replaced and they are cut to %d characters "
                         "(errors{kind=\"bad_label\"})", ", ".join(bad), max_label_value_length)
        self._generation = 0
        #: The hot path's ring, whose running totals (every cycle's host times, the acceptance
        #: and batch sizes it counted itself) the snapshot adds in; None before one attaches.
        self._ring: Any = None
        #: Called before each snapshot, outside the lock: the resolver's ``catch_up``.
        self.catch_up: Callable[[], None] | None = None
        #: The recording thread's time on and off a CPU, read at each snapshot.
        self._thread_time = WorkerThreadTime()
        self._ring_offset_ns = 0

    def attach_ring(self, ring: Any, offset_ns: int) -> None:
        """Read ``ring.totals()`` into every snapshot (``offset_ns`` turns its stamps into wall
        time): the resolver drains the common case into the ring itself (``drain_into``) and
        applies here only what needed Python."""
        with self._lock:
            self._ring = ring
            self._ring_offset_ns = offset_ns
            self._generation += 1

    @property
    def generation(self) -> int:
        """Moves with every change: a sink may cache what it rendered from a snapshot until it
        does (the Prometheus endpoint does)."""
        ring = self._ring
        return (self._generation + (ring.drained if ring is not None else 0)
                + self.requests.changes)

    def _zero(self, created_unix_nano: int, cpu_components: Iterable[str]) -> None:
        buckets = catalog.DURATION_BUCKETS_SECONDS
        #: What the resolver buckets durations by (every duration histogram shares them).
        self.duration_bounds: tuple[float, ...] = tuple(buckets)
        # Indexed [phase index] so the resolver's chunk is applied without dict lookups.
        self.phase_gpu = [_Histogram(buckets) for _ in self.phases]
        self.phase_host = [_Histogram(buckets) for _ in self.phases]
        self.cycle_gpu = _Histogram(buckets)
        self.cycle_host = _Histogram(buckets)
        # Every gap between cycles is measured by the ring's drain (its running totals): this
        # one stays empty, the bounds and the frozen copy's shape.
        self.cycle_gap = _Histogram(buckets)
        self.accept_length = _Histogram(catalog.accept_length_buckets(self.max_draft_length))
        self.batch_size = _Histogram(catalog.BATCH_SIZE_BUCKETS)
        # Sequences by draft length k (0..max): drafted-by-position is derived from it.
        self.drafted_by_k = [0] * (self.max_draft_length + 1)
        # By draft length, what needed Python (the ring's totals hold the rest): cycles, host ns
        # per phase and emitted tokens by the cycle's k; accepted tokens by each sequence's k.
        self.k_cycles: dict[int, int] = {}
        self.k_host_ns: dict[int, list[int]] = {}
        self.k_emitted: dict[int, int] = {}
        self.k_accepted: dict[int, int] = {}
        self.k_batch: dict[int, int] = {}
        self.cycles = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.emitted_tokens = 0
        self.sampled_cycles = 0
        self.last_cycle_timestamp: float | None = None
        self.requests_running: float | None = None
        self.requests_waiting: float | None = None
        #: Drafts the engine left out of verification (None until it reports some).
        self.draft_tokens_unverified: int | None = None
        previous: _RequestAcceptance | None = getattr(self, "requests", None)
        self.requests = _RequestAcceptance(previous.changes + 1 if previous is not None else 0)
        self.dropped: dict[str, int] = dict.fromkeys(catalog.DROP_REASONS, 0)
        self.errors: dict[str, int] = dict.fromkeys(catalog.ERROR_KINDS, 0)
        self.cpu_seconds: dict[str, float] = dict.fromkeys(cpu_components, 0.0)
        self.sampling_interval = 1
        self.overhead_ratio = 0.0
        self.created_unix_nano = created_unix_nano

    # -- writes (any thread; each one under the lock) ---------------------------------------------
    def after_fork_in_child(self) -> None:
        """In a forked child: a new lock (the parent's may have been held at the fork), and every
        total from zero with a new creation time (OpenMetrics ``_created`` and OTLP start times
        move, so consumers see a new series, not a counter going down). Labels, info, phases,
        the baseline and the CPU components stay."""
        self._lock = GuardedLock()
        self._deferred = []
        self._thread_time.after_fork_in_child()
        with self._lock:
            self._zero(time.time_ns(), list(self.cpu_seconds))
            if self._ring is not None:
                self._ring.reset_totals()
            self._generation += 1

    def read_thread_time(self) -> None:
        """Add the recording thread's CPU and wait time since the last read (a file read, outside
        the lock; the resolver calls it a few times a second, every snapshot once)."""
        ring = self._ring
        if ring is not None:
            self._thread_time.update(ring.writer)

    def _write(self, body: Callable[..., None], *args: Any) -> None:
        """``body(*args)`` under the lock; kept for the next write or snapshot when this thread
        holds the lock already (a signal handler that interrupted it there)."""
        if not self._lock.acquire():
            self._deferred.append((body, args))
            return
        try:
            if self._deferred:
                self._apply_deferred()
            body(*args)
        finally:
            self._lock.release()

    def _apply_deferred(self) -> None:
        """The writes kept by :meth:`_write`, in order (the lock held)."""
        while self._deferred:
            body, args = self._deferred.pop(0)
            body(*args)

    def add_cpu(self, component: str, seconds: float) -> None:
        """Count ``seconds`` of thread CPU ``component`` spent (``specobs_exporter_cpu_time``)."""
        self._write(self._add_cpu, component, seconds)

    def _add_cpu(self, component: str, seconds: float) -> None:
        self.cpu_seconds[component] = self.cpu_seconds.get(component, 0.0) + seconds

    def count_dropped(self, reason: str, n: int) -> None:
        """Count ``n`` records, spans or exports lost for ``reason`` (a catalog drop reason)."""
        if n > 0:
            self._write(self._count, {reason: n}, {})

    def count(self, dropped: dict[str, int], errors: dict[str, int]) -> None:
        """Add counts of drops and errors by reason and kind (the recorder's, folded in)."""
        if dropped or errors:
            self._write(self._count, dropped, errors)

    def _count(self, dropped: dict[str, int], errors: dict[str, int]) -> None:
        for reason, n in dropped.items():
            self.dropped[reason] = self.dropped.get(reason, 0) + n
        for kind, n in errors.items():
            self.errors[kind] = self.errors.get(kind, 0) + n
        self._generation += 1

    def set_requests(self, running: float | None, waiting: float | None) -> None:
        """Set the request gauges (validated numbers; ``None`` leaves a gauge as it is)."""
        self._write(self._set_requests, running, waiting)

    def _set_requests(self, running: float | None, waiting: float | None) -> None:
        if running is not None:
            self.requests_running = running
        if waiting is not None:
            self.requests_waiting = waiting
        self._generation += 1

    def drafts_unverified(self, tokens: int) -> None:
        """Add draft tokens the engine left out of verification (validated: an int >= 0)."""
        self._write(self._drafts_unverified, tokens)

    def _drafts_unverified(self, tokens: int) -> None:
        self.draft_tokens_unverified = (self.draft_tokens_unverified or 0) + tokens
        self._generation += 1

    def request_finished(self, drafted: int, accepted: int, trace_id: int | None) -> None:
        """Count one finished request (validated: ``0 <= accepted <= drafted``; ``trace_id`` a
        nonzero 128-bit id or ``None``). One that drafted nothing is counted as finished only."""
        self.requests.observe(drafted, accepted, trace_id)

    def set_sampling(self, interval: int, overhead_ratio: float | None,
                     hot_path_seconds: float) -> None:
        """The adaptive sampler's state after a chunk, and the event records' measured cost."""
        with self._lock:
            if hot_path_seconds:
                self.cpu_seconds["hot_path"] = self.cpu_seconds.get("hot_path", 0.0) + (
                    hot_path_seconds
                )
            self.sampling_interval = interval
            if overhead_ratio is not None:
                self.overhead_ratio = overhead_ratio

    def apply(self, chunk: Chunk) -> None:
        """Add one resolved :class:`Chunk`, whole."""
        with self._lock:
            if self._deferred:
                self._apply_deferred()
            self._count(chunk.dropped, chunk.errors)
            gpu_cycle = chunk.gpu_cycle
            if gpu_cycle is not None:
                self.sampled_cycles += sum(gpu_cycle[0])
                for i, b in enumerate(chunk.gpu_phases):
                    self.phase_gpu[i].add(b, 1e-9)
                self.cycle_gpu.add(gpu_cycle, 1e-9)
            acceptance = chunk.acceptance
            if acceptance is not None:
                self.draft_tokens += acceptance.drafted
                self.accepted_tokens += acceptance.accepted
                self.emitted_tokens += acceptance.emitted
                al = self.accept_length
                counts = al.counts
                for value, n in enumerate(acceptance.length_counts):
                    if n:
                        counts[value] += n
                al.sum += acceptance.accepted
                dbk = self.drafted_by_k
                for k, n in acceptance.sequences_by_draft_length.items():
                    dbk[k] += n
                add_counts(self.k_accepted, acceptance.accepted_by_draft_length)
            if chunk.by_draft_length is not None:
                kc, kh, ke, _, kb = chunk.by_draft_length
                add_counts(self.k_cycles, kc)
                add_counts(self.k_emitted, ke)
                add_counts(self.k_batch, kb)
                add_ns_by_k(self.k_host_ns, kh)
            if chunk.batch_sizes is not None:
                self.batch_size.add(chunk.batch_sizes, 1.0)
            for r in chunk.traced:
                self._exemplars(r)
            self._generation += 1

    def _exemplars(self, r: ResolvedCycle) -> None:
        # GPU-timed cycles put exemplars on the GPU-clock histograms, host-only ones on the host's.
        if r.trace_id is None or r.span_id is None:
            return
        if r.gpu_ns is not None:
            durations, phases, cycle = r.gpu_ns, self.phase_gpu, self.cycle_gpu
        else:
            durations, phases, cycle = r.host_ns, self.phase_host, self.cycle_host
        when = r.end_wall_ns
        span_ids = r.phase_span_ids or []
        for i, ns in enumerate(durations):
            h = phases[i]
            v = ns * 1e-9  # the same float the histogram counted
            h.exemplars[h.bucket(v)] = Exemplar(v, r.trace_id, span_ids[i], when)
        v = sum(durations) * 1e-9
        cycle.exemplars[cycle.bucket(v)] = Exemplar(v, r.trace_id, r.span_id, when)

    # -- reads ---------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """Copy everything under the lock, the ring's running totals added in: O(buckets), a
        few microseconds. The totals are read in one call, under the GIL, which the resolver's
        drain holds from its first cycle to its last: a snapshot never sees half a chunk."""
        catch_up = self.catch_up
        if catch_up is not None:
            try:
                catch_up()
            except Exception as exc:  # the snapshot goes on with what is counted already
                _log.warning("specobs: the resolver's catch-up before a snapshot failed: %r", exc)
        self.read_thread_time()
        # A signal handler that interrupted this thread inside the lock reads the
        # aggregation as it stands (the interrupted write at most half made) rather than
        # waiting for itself.
        locked = self._lock.acquire()
        try:
            if locked and self._deferred:
                self._apply_deferred()
            return self._frozen()
        finally:
            if locked:
                self._lock.release()

    def _frozen(self) -> Snapshot:
        """The snapshot's copy, the lock held: what the aggregation holds, the ring's running
        totals added."""
        ring = self._ring
        t = RingTotals._make(ring.totals()) if ring is not None else None
        cycles, drafted, accepted, emitted = (
            self.cycles, self.draft_tokens, self.accepted_tokens, self.emitted_tokens)
        drafted_by_k = self.drafted_by_k
        by_k = _ByK(self, t)
        last = self.last_cycle_timestamp
        accept_length = self.accept_length.freeze()
        batch_size = self.batch_size.freeze()
        if t is not None:
            cycles += t.cycles
            accept_length = self.accept_length.freeze(
                (t.sequences_by_accepted, t.accepted), 1.0)
            accepted += t.accepted
            drafted += t.drafted
            emitted += t.emitted
            if t.sequences_by_draft_length:
                drafted_by_k = list(drafted_by_k)
                for k, n in t.sequences_by_draft_length.items():
                    drafted_by_k[k] += n
            batch_size = self.batch_size.freeze(t.batch, 1.0)
            if t.last_end_ns is not None:
                native_last = (self._ring_offset_ns + t.last_end_ns) / 1e9
                last = native_last if last is None else max(last, native_last)
        request_acceptance, requests_finished = self.requests.freeze()
        return Snapshot(
            phases=self.phases,
            max_draft_length=self.max_draft_length,
            labels=dict(self.labels),
            info=dict(self.info),
            cycles_total=cycles,
            draft_tokens_total=drafted,
            accepted_tokens_total=accepted,
            emitted_tokens_total=emitted,
            accept_length=accept_length,
            drafted_by_position=tuple(
                sum(drafted_by_k[j + 1 :]) for j in range(self.max_draft_length)
            ),
            batch_size=batch_size,
            last_cycle_timestamp_seconds=last,
            baseline_tokens_per_second=by_k.baseline,
            requests_running=self.requests_running,
            requests_waiting=self.requests_waiting,
            draft_tokens_unverified=self.draft_tokens_unverified,
            dropped=dict(self.dropped),
            errors=dict(self.errors),
            cpu_seconds=dict(self.cpu_seconds),
            sampling_interval=self.sampling_interval,
            sampling_budget_ratio=self.sampling_budget_ratio,
            overhead_ratio=self.overhead_ratio,
            created_unix_nano=self.created_unix_nano,
            worker_thread_seconds=self._thread_time.seconds(),
            cycles_by_draft_length=by_k.cycles,
            phase_seconds_by_draft_length=by_k.phase_seconds,
            emitted_by_draft_length=by_k.emitted,
            accepted_by_draft_length=by_k.accepted,
            sequences_by_draft_length={
                k: n for k, n in enumerate(drafted_by_k) if k in by_k.accepted},
            baseline_source=by_k.baseline_source,
            batch_by_draft_length=by_k.batch,
            request_acceptance=request_acceptance,
            requests_finished_total=requests_finished,
            **self._frozen_durations(t),
        )

    def _frozen_durations(self, t: RingTotals | None) -> dict[str, Any]:
        """The snapshot's duration histograms and gaps, and the sampled cycles: the
        aggregation's, the ring's totals added (they hold every cycle's host times, and the
        GPU times of the sampled cycles the ring read itself)."""
        nph = len(self.phases)
        phase_h: dict[tuple[str, str], HistogramData] = {}
        for i, p in enumerate(self.phases):
            phase_h[(p, "gpu")] = self.phase_gpu[i].freeze(t.gpu[i] if t else None)
            phase_h[(p, "host")] = self.phase_host[i].freeze(t.host[i] if t else None)
        return {
            "phase_histograms": phase_h,
            "cycle_histograms": {
                "gpu": self.cycle_gpu.freeze(t.gpu[nph] if t else None),
                "host": self.cycle_host.freeze(t.host[nph] if t else None),
            },
            "sampled_cycles_total": self.sampled_cycles + (sum(t.gpu[nph][0]) if t else 0),
            "cycle_gap": self.cycle_gap.freeze(t.gap if t else None),
            "idle_gaps_total": t.idle_gaps if t else 0,
        }


class _ByK:
    """The snapshot's series by draft length: the aggregation's (what needed Python) and the
    ring's running totals added, keys sorted; and the baseline, configured or else measured
    from the cycles of draft length 0 (one token per sequence each, so the per-sequence rate is
    those cycles over their host seconds, cumulative), once ``PLAIN_STEPS_MIN_CYCLES`` ran."""

    __slots__ = ("accepted", "baseline", "baseline_source", "batch", "cycles", "emitted",
                 "phase_seconds")

    def __init__(self, agg: Aggregation, t: RingTotals | None) -> None:
        cycles = dict(agg.k_cycles)
        emitted = dict(agg.k_emitted)
        accepted = dict(agg.k_accepted)
        batch = dict(agg.k_batch)
        host = {k: list(v) for k, v in agg.k_host_ns.items()}
        if t is not None:
            add_counts(cycles, t.cycles_by_draft_length)
            add_counts(emitted, t.emitted_by_draft_length)
            add_counts(batch, t.batch_by_draft_length)
            add_counts(accepted, t.accepted_by_draft_length)
            add_ns_by_k(host, t.host_ns_by_draft_length)
        nph = len(agg.phases)
        self.cycles = {k: cycles[k] for k in sorted(cycles)}
        self.emitted = {k: emitted.get(k, 0) for k in self.cycles}
        self.batch = {k: batch.get(k, 0) for k in self.cycles}
        self.accepted = {k: accepted[k] for k in sorted(accepted)}
        self.phase_seconds = {k: tuple(ns * 1e-9 for ns in host.get(k, [0] * nph))
                              for k in self.cycles}
        self.baseline = agg.baseline_tokens_per_second
        self.baseline_source: str | None = None
        k0_ns = sum(host.get(0, ()))
        if (self.baseline is None and cycles.get(0, 0) >= catalog.PLAIN_STEPS_MIN_CYCLES
                and k0_ns > 0):
            self.baseline = cycles[0] / (k0_ns * 1e-9)
            self.baseline_source = catalog.BASELINE_SOURCE_PLAIN_STEPS
