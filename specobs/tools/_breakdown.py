"""The cycle breakdown of one interval: one definition for ``specobs top``, ``doctor``, ``report``
and the ``specobs demo`` summary, the same quantities the recording rules compute.

:func:`breakdown` turns a :class:`~specobs.tools._scrape.Delta` (counter deltas over an interval,
the current gauges and the interval's seconds) into a :class:`Breakdown`. A Delta comes from two
scrapes of an endpoint (:func:`specobs.tools._scrape.difference`), from a Prometheus server's
``increase()`` (:func:`specobs.tools._promapi.prometheus_delta`) or from two in-process
:class:`specobs.Snapshot` reads (:func:`snapshot_delta`, the demo's live summary). Numbers are
never computed from lifetime totals, and every ratio with a zero denominator is ``None`` (shown
as a dash), never a division by zero.

Each field, and the recording rule in ``specobs/mixin/_rules.py`` that computes the same thing
from the same counters (names for the default ``rate_window`` of 5m):

* ``stats[phase, clock].mean_seconds``: phase sum / phase count on that clock (the GPU clock has
  its own count, only sampled cycles carry it): ``instance:specobs_phase_duration_seconds:
  mean_rate5m``. ``.share``: that mean over the sum of the phases' means on the clock:
  ``...:share_rate5m``. ``.p50_seconds`` / ``.p99_seconds``: ``histogram_quantile`` over the
  bucket deltas.
* ``cycle_mean_seconds[clock]``: ``instance:specobs_cycle_duration_seconds:mean_rate5m``
  (recorded for the host clock only, as ``...:p99_rate5m``); ``cycle_quantiles[clock]``: p50
  and ``...:p99_rate5m``.
* ``cycles_per_second``: ``instance:specobs_cycles:rate5m``; ``emitted_tokens_per_second``:
  ``instance:specobs_emitted_tokens:rate5m``.
* ``acceptance_rate``: accepted / drafted tokens, ``instance:specobs_acceptance:ratio_rate5m``.
* ``mean_accept_length``: accept-length sum / count, bonus token excluded,
  ``instance:specobs_accept_length_excl_bonus:mean_rate5m``.
* ``position_acceptance``: accepted / drafted tokens at each draft position (a sequence that
  drafted fewer than k tokens counts only at the positions it drafted), the cycle-breakdown
  dashboard's per-position panel.
* ``mean_batch_size``: sequences (the batch-size sum) / cycles,
  ``instance:specobs_batch_size:mean_rate5m``.
* ``mean_draft_length``: the draft-length histogram's sum / count (the k in effect, cycles that
  have one); ``draft_length_shares``: each k's share of the cycles by draft length, k as text,
  the cycle-breakdown dashboard's "Cycles by draft length".
* ``sequence_tokens_per_second``: emitted tokens per sequence (over the batch-size sum) / the
  host clock's mean cycle, ``instance:specobs_sequence_tokens_per_second:rate5m``.
* ``baseline_tokens_per_second``: the gauge,
  ``instance:specobs_baseline_sequence_tokens_per_second:max``; :func:`speedups` gives
  ``instance:specobs_speedup:realized_rate5m`` and ``...:predicted_rate5m``.
* ``gap_count``, ``gap_mean_seconds``, ``gap_median_seconds``, ``gap_p99_seconds``: the time
  between cycles (``specobs_cycle_gap_seconds``: from the end of a cycle to the begin of the
  next one its thread recorded, idle gaps left out), observations, sum / count
  (``instance:specobs_cycle_gap_seconds:mean_rate5m``) and ``histogram_quantile`` 0.5 / 0.99
  over the bucket deltas; ``gap_share``: gap sum / (gap sum + host cycle-duration sum), the
  share of the engine's busy time spent outside cycles
  (``instance:specobs_cycle_gap:share_rate5m``); ``idle_gaps``: the gaps over the idle bound
  (``specobs_cycle_idle_gaps_total``), counted instead.
* ``by_draft_length``: one :class:`KStats` per draft length k with cycles in the interval,
  sorted by k, from the series by k: cycles, sequences (the batch sizes of those cycles; over
  cycles, ``KStats.mean_batch``), emitted tokens, host seconds per phase (over cycles,
  ``KStats.phase_mean_seconds``) by the cycle's k, and accepted / drafted tokens by each
  sequence's own k. ``None`` where the endpoint exports no such series (sequences came later).
* ``drops``: ``instance:specobs_exporter_dropped_records:rate5m`` by reason; ``dropped_total``
  sums specobs's own (every reason but ``exception``, as the dropped-records alert and ``doctor``
  do), ``engine_raised`` is the cycles the engine raised inside (discarded: its failure).

tests/test_report.py checks this module against a real Prometheus window (``top`` and the
report agree); tests/test_breakdown.py checks that the demo summary and ``top`` agree number for
number on the same snapshots, and the definitions on a stream where they used to differ.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specobs import catalog
from specobs._model import CLOCKS, HistogramData, Snapshot
from specobs._series import families, le_text
from specobs.tools._scrape import CounterReset, Delta, Scrape, Series, difference

__all__ = [
    "CLOCKS",
    "Breakdown",
    "KStats",
    "PhaseStats",
    "breakdown",
    "cumulative_buckets",
    "histogram_quantile",
    "histogram_stdev",
    "ratio",
    "snapshot_delta",
    "snapshot_series",
    "speedups",
]

# -- the breakdown --------------------------------------------------------------------------------


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``, or ``None`` when either is missing or the denominator is not positive."""
    if num is None or den is None or not den > 0 or math.isnan(num):
        return None
    return num / den


def histogram_quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """Prometheus's ``histogram_quantile`` over cumulative bucket counts keyed by ``le``.

    Linear interpolation inside the bucket holding rank ``q * total``; the lowest bucket
    starts at 0; a rank in the +Inf bucket returns the highest finite bound. ``None`` when there
    are no observations.
    """
    if not cumulative or not 0.0 <= q <= 1.0:
        return None
    bounds = sorted(cumulative)
    if bounds[-1] != math.inf:
        return None
    counts = [cumulative[b] for b in bounds]
    # Deltas of cumulative counts can come out non-monotonic only through float noise.
    for i in range(1, len(counts)):
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if not total > 0:
        return None
    rank = q * total
    i = next(i for i, c in enumerate(counts) if c >= rank)
    if bounds[i] == math.inf:
        return bounds[-2] if len(bounds) > 1 else None
    lower = 0.0 if i == 0 else bounds[i - 1]
    below = 0.0 if i == 0 else counts[i - 1]
    if i == 0 and bounds[0] <= 0:
        return bounds[0]
    in_bucket = counts[i] - below
    if in_bucket <= 0:
        return bounds[i]
    return lower + (bounds[i] - lower) * (rank - below) / in_bucket


def histogram_stdev(cumulative: Mapping[float, float]) -> float | None:
    """The spread of the observations over cumulative bucket counts keyed by ``le``: each
    bucket's observations taken at its midpoint (the lowest bucket from 0, the +Inf bucket at the
    highest finite bound), so observations that share a bucket count as alike and only those in
    distant buckets spread it. ``None`` without observations or an +Inf bucket."""
    if not cumulative:
        return None
    bounds = sorted(cumulative)
    if bounds[-1] != math.inf:
        return None
    mids: list[tuple[float, float]] = []
    below, lower = 0.0, 0.0
    for b in bounds:
        count = max(0.0, cumulative[b] - below)
        below = max(below, cumulative[b])
        mids.append((lower if b == math.inf else (lower + b) / 2, count))
        if b != math.inf:
            lower = b
    total = math.fsum(c for _, c in mids)
    if not total > 0:
        return None
    mean = math.fsum(m * c for m, c in mids) / total
    return math.sqrt(math.fsum(c * (m - mean) ** 2 for m, c in mids) / total)


@dataclass(frozen=True)
class PhaseStats:
    """One phase on one clock over the interval; times in seconds, ``None`` when unknown."""

    phase: str
    clock: str
    count: float
    mean_seconds: float | None
    share: float | None
    p50_seconds: float | None
    p99_seconds: float | None
    #: The spread of one observation (:func:`histogram_stdev`); ``None`` without buckets.
    stdev_seconds: float | None = None


@dataclass(frozen=True)
class KStats:
    """The cycles of one draft length k in effect over the interval (counter deltas): cycles,
    sequences (their batch sizes summed), emitted tokens and host seconds per phase by the
    cycle's k; accepted and drafted tokens by each sequence's own k (the drafts it verified,
    which differ from the cycle's k where an engine verifies one k and drafts another).
    ``None``: the endpoint exports no such series."""

    k: int
    cycles: float
    sequences: float | None
    emitted: float | None
    accepted: float | None
    drafted: float | None
    phase_seconds: dict[str, float]

    @property
    def mean_batch(self) -> float | None:
        """Sequences per cycle at this k (the tokens verified per cycle are this x (k + 1))."""
        return ratio(self.sequences, self.cycles)

    def phase_mean_seconds(self, phase: str) -> float | None:
        """Mean host seconds per cycle of ``phase`` at this k (``None``: the phase not seen)."""
        return ratio(self.phase_seconds.get(phase), self.cycles)


@dataclass(frozen=True)
class Breakdown:
    """Everything ``specobs top`` shows for one interval (all from counter deltas)."""

    elapsed_seconds: float
    phases: tuple[str, ...]
    stats: dict[tuple[str, str], PhaseStats]
    cycle_mean_seconds: dict[str, float | None]
    cycle_counts: dict[str, float]
    cycle_quantiles: dict[str, tuple[float | None, float | None]]
    cycles: float
    cycles_per_second: float | None
    sampled_cycles: float | None
    acceptance_rate: float | None
    mean_accept_length: float | None
    position_acceptance: tuple[tuple[str, float | None], ...]
    emitted_tokens_per_second: float | None
    mean_batch_size: float | None
    sequence_tokens_per_second: float | None
    baseline_tokens_per_second: float | None
    #: Dropped cycle records by reason, every reason counted in the interval.
    drops: dict[str, float]
    #: specobs's own drops: every reason but ``exception`` (what its metrics undercount by).
    dropped_total: float
    sampling_interval: float | None
    overhead_ratio: float | None
    #: specobs's CPU per cycle but for rendering /metrics (that comes per scrape: a viewer that
    #: scrapes often would count its own requests).
    exporter_cpu_seconds_per_cycle: float | None
    info: dict[str, str] = field(default_factory=dict)
    #: Cycles the engine raised inside, discarded (``reason="exception"``): the engine's failure,
    #: not in ``dropped_total``.
    engine_raised: float = 0.0
    #: The recording thread's seconds on a CPU and runnable waiting for one, per cycle
    #: (``specobs_worker_thread_time``; ``None`` where the kernel does not say).
    worker_running_seconds_per_cycle: float | None = None
    worker_waiting_seconds_per_cycle: float | None = None
    #: The engine thread's time copying CUDA acceptance tensors to the host, per cycle (part of
    #: ``exporter_cpu_seconds_per_cycle``; 0 where acceptance came as host data).
    acceptance_copy_seconds_per_cycle: float | None = None
    #: The engine's requests running and waiting at the interval's end (the gauges
    #: ``set_requests`` sets; ``None`` where the engine reports none).
    requests_running: float | None = None
    requests_waiting: float | None = None
    #: The k in effect: mean draft length per cycle, and each k's share of the cycles (k as
    #: text, in numeric order; empty where the endpoint exports no draft length).
    mean_draft_length: float | None = None
    draft_length_shares: tuple[tuple[str, float | None], ...] = ()
    #: The time between cycles (see the module docstring): gaps observed, their mean, median and
    #: p99 seconds, their share of gaps plus host cycle time, and the idle gaps left out.
    gap_count: float = 0.0
    gap_mean_seconds: float | None = None
    gap_median_seconds: float | None = None
    gap_p99_seconds: float | None = None
    gap_share: float | None = None
    idle_gaps: float = 0.0
    #: Per draft length in effect, the k with cycles in the interval, sorted by k.
    by_draft_length: tuple[KStats, ...] = ()

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens a drafting sequence gains per cycle, the bonus token included: vLLM's "mean
        acceptance length" (1 + accepted / drafts). ``mean_accept_length`` is the accepted
        drafts alone (0..k), the histogram's mean."""
        m = self.mean_accept_length
        return None if m is None else 1.0 + m

    def as_json(self) -> dict[str, Any]:
        """Every field, the per-phase statistics keyed ``phase/clock`` and the per-k ones as a
        list with their mean batch (what ``top --json`` and ``report --json`` print)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["stats"] = {f"{p}/{c}": dataclasses.asdict(st) for (p, c), st in self.stats.items()}
        out["by_draft_length"] = [{**dataclasses.asdict(ks), "mean_batch": ks.mean_batch}
                                  for ks in self.by_draft_length]
        realized, predicted = speedups(self)
        out["speedup_realized"] = realized
        out["speedup_predicted"] = predicted
        return out

    def own_drops(self) -> list[tuple[str, float]]:
        """specobs's own drops by reason, sorted by reason: the parts of ``dropped_total``."""
        return _own_drops(self.drops)


def _own_drops(drops: Mapping[str, float]) -> list[tuple[str, float]]:
    """Every reason but ``exception`` (the engine's failure), sorted by reason."""
    return sorted((k, v) for k, v in drops.items() if k != catalog.DROP_REASON_EXCEPTION)


#: The ``specobs_exporter_cpu_time_seconds_total`` component of rendering /metrics for a scrape.
SCRAPE_CPU_COMPONENT = "prometheus"


def _phases(delta: Series, gauges: Series) -> tuple[str, ...]:
    info = gauges.labels(catalog.INFO.name)
    declared = [p for p in (info[0].get("phases", "") if info else "").split(",") if p]
    seen = list(delta.by(catalog.PHASE_DURATION.name + "_count", "phase"))
    extra = [p for p in seen if p not in declared]
    return (*declared, *extra)


def cumulative_buckets(series: Series, name: str, **match: str) -> dict[float, float]:
    """A histogram's cumulative bucket values by upper bound (``le`` as a float)."""
    out: dict[float, float] = {}
    for le, value in series.by(name + "_bucket", "le", **match).items():
        try:
            out[float(le)] = value
        except ValueError:
            continue
    return out


#: A duration histogram over the interval: observations, mean seconds and (p50, p99) seconds.
_Durations = tuple[float, float | None, tuple[float | None, float | None]]


def _durations(series: Series, name: str, **match: str) -> _Durations:
    n = series.total(name + "_count", **match) or 0.0
    buckets = cumulative_buckets(series, name, **match)
    quantiles = (histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets))
    return n, ratio(series.total(name + "_sum", **match), n), quantiles


def breakdown(delta: Delta) -> Breakdown:
    """The cycle breakdown of one interval; see the module docstring."""
    d, g, elapsed = delta.counters, delta.gauges, delta.elapsed_seconds
    phases = _phases(d, g)
    cycle = {clock: _durations(d, catalog.CYCLE_DURATION.name, clock=clock) for clock in CLOCKS}
    cycles = d.total(catalog.CYCLES.name) or 0.0
    emitted = d.total(catalog.EMITTED_TOKENS.name)
    al = catalog.ACCEPT_LENGTH.name
    bs = catalog.BATCH_SIZE.name
    dl = catalog.DRAFT_LENGTH.name
    drops = {k: v for k, v in d.by(catalog.DROPPED_RECORDS.name, "reason").items() if v > 0}
    _, host_cycle, _ = cycle["host"]
    thread = d.by(catalog.WORKER_THREAD_TIME.name, "state")
    info_labels = g.labels(catalog.INFO.name)
    by_k = {k: v for k, v in d.by(catalog.CYCLES_BY_DRAFT_LENGTH.name, "draft_length").items()
            if v > 0}
    k_cycles = math.fsum(by_k.values())
    return Breakdown(
        elapsed_seconds=elapsed,
        phases=phases,
        stats=_phase_stats(d, phases),
        cycle_mean_seconds={c: mean for c, (_, mean, _) in cycle.items()},
        cycle_counts={c: n for c, (n, _, _) in cycle.items()},
        cycle_quantiles={c: quantiles for c, (_, _, quantiles) in cycle.items()},
        cycles=cycles,
        cycles_per_second=ratio(cycles, elapsed),
        sampled_cycles=d.total(catalog.SAMPLED_CYCLES.name),
        acceptance_rate=ratio(d.total(catalog.ACCEPTED_TOKENS.name),
                              d.total(catalog.DRAFT_TOKENS.name)),
        mean_accept_length=ratio(d.total(al + "_sum"), d.total(al + "_count")),
        position_acceptance=_position_acceptance(d),
        emitted_tokens_per_second=ratio(emitted, elapsed),
        # Sequences per cycle, as the rule divides them: cycles that reported no batch count too.
        mean_batch_size=ratio(d.total(bs + "_sum"), cycles),
        sequence_tokens_per_second=ratio(ratio(emitted, d.total(bs + "_sum")), host_cycle),
        baseline_tokens_per_second=g.total(catalog.BASELINE_SEQUENCE_TOKENS.name),
        requests_running=g.total(catalog.REQUESTS_RUNNING.name),
        requests_waiting=g.total(catalog.REQUESTS_WAITING.name),
        mean_draft_length=ratio(d.total(dl + "_sum"), d.total(dl + "_count")),
        draft_length_shares=tuple((k, ratio(by_k[k], k_cycles))
                                  for k in sorted(by_k, key=lambda k: (len(k), k))),
        drops=drops,
        dropped_total=math.fsum(v for _, v in _own_drops(drops)),
        engine_raised=drops.get(catalog.DROP_REASON_EXCEPTION, 0.0),
        sampling_interval=g.total(catalog.SAMPLING_INTERVAL.name),
        overhead_ratio=g.max(catalog.OVERHEAD_RATIO.name),
        exporter_cpu_seconds_per_cycle=ratio(_exporter_cpu(d), cycles),
        info=info_labels[0] if info_labels else {},
        worker_running_seconds_per_cycle=ratio(thread.get("running"), cycles),
        worker_waiting_seconds_per_cycle=ratio(thread.get("waiting"), cycles),
        acceptance_copy_seconds_per_cycle=ratio(
            d.total(catalog.EXPORTER_CPU.name, component="acceptance_copy") or 0.0, cycles),
        **_gaps(d),
        by_draft_length=_k_stats(d, by_k),
    )


def _phase_stats(d: Series, phases: tuple[str, ...]) -> dict[tuple[str, str], PhaseStats]:
    """Each phase's statistics on each clock, its share of the phases' sum on that clock."""
    stats: dict[tuple[str, str], PhaseStats] = {}
    for clock in CLOCKS:
        on_clock = {p: _durations(d, catalog.PHASE_DURATION.name, phase=p, clock=clock)
                    for p in phases}
        known = [mean for _, mean, _ in on_clock.values() if mean is not None]
        whole = math.fsum(known) if known else None
        for phase, (n, mean, (p50, p99)) in on_clock.items():
            spread = histogram_stdev(cumulative_buckets(d, catalog.PHASE_DURATION.name,
                                                        phase=phase, clock=clock))
            stats[(phase, clock)] = PhaseStats(phase, clock, n, mean, ratio(mean, whole), p50, p99,
                                               spread)
    return stats


def _position_acceptance(d: Series) -> tuple[tuple[str, float | None], ...]:
    """Accepted over drafted tokens at each draft position, in position order."""
    acc_pos = d.by(catalog.ACCEPTED_BY_POSITION.name, "position")
    draft_pos = d.by(catalog.DRAFTED_BY_POSITION.name, "position")
    positions = sorted(set(acc_pos) | set(draft_pos), key=lambda p: (len(p), p))
    return tuple((p, ratio(acc_pos.get(p), draft_pos.get(p))) for p in positions)


def _exporter_cpu(d: Series) -> float | None:
    """The exporter's CPU seconds that every cycle causes: rendering /metrics comes per scrape,
    and a viewer that scrapes every second (top, doctor) would otherwise count its own
    requests."""
    cpu_all = d.total(catalog.EXPORTER_CPU.name)
    scrapes_cpu = d.total(catalog.EXPORTER_CPU.name, component=SCRAPE_CPU_COMPONENT) or 0.0
    return None if cpu_all is None else max(0.0, cpu_all - scrapes_cpu)


def _gaps(d: Series) -> dict[str, Any]:
    """The time between cycles: the :class:`Breakdown` fields ``gap_*`` and ``idle_gaps``."""
    gap_n, gap_mean, (gap_p50, gap_p99) = _durations(d, catalog.CYCLE_GAP.name)
    gap_sum = d.total(catalog.CYCLE_GAP.name + "_sum")
    host_sum = d.total(catalog.CYCLE_DURATION.name + "_sum", clock="host")
    return {
        "gap_count": gap_n, "gap_mean_seconds": gap_mean, "gap_median_seconds": gap_p50,
        "gap_p99_seconds": gap_p99,
        "gap_share": ratio(gap_sum, (gap_sum or 0.0) + (host_sum or 0.0)),
        "idle_gaps": d.total(catalog.IDLE_GAPS.name) or 0.0,
    }


def _k_stats(d: Series, by_k: Mapping[str, float]) -> tuple[KStats, ...]:
    """One :class:`KStats` per draft length with cycles (``by_k``: cycles by k as text; a label
    that is not a decimal k is left out), sorted by k."""
    c = catalog
    per_k = {
        name: d.by(name, "draft_length")
        for name in (c.SEQUENCES_BY_DRAFT_LENGTH.name, c.EMITTED_BY_DRAFT_LENGTH.name,
                     c.ACCEPTED_BY_DRAFT_LENGTH.name, c.DRAFTED_BY_DRAFT_LENGTH.name)
    }  # fmt: skip
    out: list[KStats] = []
    for text, cycles in by_k.items():
        try:
            k = int(text)
        except ValueError:
            continue
        seqs, emitted, accepted, drafted = (per_k[name].get(text) for name in per_k)
        out.append(KStats(
            k, cycles, seqs, emitted, accepted, drafted,
            d.by(c.PHASE_TIME_BY_DRAFT_LENGTH.name, "phase", draft_length=text),
        ))  # fmt: skip
    return tuple(sorted(out, key=lambda s: s.k))


def speedups(
    b: Breakdown, draft_phase: str = "draft", verify_phase: str = "verify"
) -> tuple[float | None, dict[str, float | None]]:
    """Realized and predicted (per clock) speedup of one interval, as the recording rules define
    them (``instance:specobs_speedup:realized_rate*`` and ``...:predicted_rate*``).

    Realized: tokens/s per sequence over the non-speculative baseline gauge, whatever its
    ``source`` (configured, or measured by the engine at the batch size it serves, as
    ``specobs demo`` does). Predicted: tokens per sequence-cycle times verify / (draft + verify)
    on each clock. ``specobs top``, ``report`` and ``doctor`` all use this one definition.
    """
    realized = ratio(b.sequence_tokens_per_second, b.baseline_tokens_per_second)
    host_cycle = b.cycle_mean_seconds.get("host")
    per_sequence_cycle = (
        b.sequence_tokens_per_second * host_cycle
        if b.sequence_tokens_per_second is not None and host_cycle is not None else None
    )
    predicted: dict[str, float | None] = {}
    for clock in CLOCKS:
        draft, verify = b.stats.get((draft_phase, clock)), b.stats.get((verify_phase, clock))
        if draft is None or verify is None or per_sequence_cycle is None \
                or draft.mean_seconds is None or verify.mean_seconds is None:
            predicted[clock] = None
            continue
        cost = ratio(verify.mean_seconds, draft.mean_seconds + verify.mean_seconds)
        predicted[clock] = None if cost is None else per_sequence_cycle * cost
    return realized, predicted


# -- in-process snapshots as the source -----------------------------------------------------------


def snapshot_series(snapshot: Snapshot, baseline: float | None = None) -> Series:
    """The series a scrape of ``snapshot`` parses into: the exporters' own walk
    (:func:`specobs._series.families`) with the Prometheus names, labels and values
    (tests/test_breakdown.py checks it against a real exposition). ``baseline`` replaces the
    baseline gauge when given."""
    out, const = Series(), dict(snapshot.labels)
    for family in families(snapshot):
        m = family.metric
        if m is catalog.BASELINE_SEQUENCE_TOKENS and baseline is not None:
            continue
        for values, value in family.points:
            labels = {**dict(zip(family.labels, values, strict=True)), **const}
            if isinstance(value, HistogramData):
                for bound, acc in value.cumulative():
                    out.add(f"{m.name}_bucket", {**labels, "le": le_text(bound)}, float(acc))
                out.add(f"{m.name}_sum", labels, float(value.sum))
                out.add(f"{m.name}_count", labels, float(value.count))
            else:
                out.add(m.name, labels, float(value))
    if baseline is not None:
        out.add(catalog.BASELINE_SEQUENCE_TOKENS.name, const, float(baseline))
    return out


def snapshot_delta(
    new: Snapshot, old: Snapshot | None, elapsed_seconds: float, baseline: float | None = None
) -> Delta:
    """The :class:`Delta` between two reads of one observer (``old=None``: since it started),
    ``elapsed_seconds`` apart; ``baseline`` replaces the baseline gauge (a measured one)."""
    cur = Scrape(snapshot_series(new, baseline), elapsed_seconds)
    prev = Scrape(Series() if old is None else snapshot_series(old), 0.0)
    delta = difference(prev, cur)
    if isinstance(delta, CounterReset):
        # Another observer behind the same reader (a restart): count from its start.
        delta = difference(Scrape(Series(), 0.0), cur)
        assert isinstance(delta, Delta)
    return delta
