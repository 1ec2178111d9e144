"""The adaptive sampler's model of what specobs costs the worker per cycle.

The resolver hands each chunk's figures to :meth:`OverheadModel.gather`; every
``ADAPT_EVERY_NS`` the model runs on what gathered (:meth:`OverheadModel.run`) and answers the
sampling interval that keeps the cost within the budget, and the self-reported overhead ratio.
The maths is :mod:`specobs.sampling`'s; this module holds the state: moving averages of a
sampled cycle's cost, of cycle time, of the worker's acceptance copies and of the resolver's CPU
per cycle. No clock is read here: callers pass ``now`` (``perf_counter_ns``), so the model is
tested without threads or time.
"""

from __future__ import annotations

from typing import NamedTuple

import specobs.sampling as sampling

__all__ = ["ADAPT_EVERY_NS", "RESOLVER_FIGURE_CYCLES", "RESOLVER_FIGURE_NS", "Counts", "CpuLedger",
           "OverheadModel", "Reading"]

#: How often the sampler re-reads its figures (ns): each run is Python with the GIL held, so it
#: is paid a few times a second, not once a slice; over this long the figures are steadier too.
ADAPT_EVERY_NS = 20_000_000
#: The resolver's CPU per cycle is read over at least this many cycles, or this long when
#: cycles are slow: one short slice must not read as a spike.
RESOLVER_FIGURE_CYCLES = 256
RESOLVER_FIGURE_NS = 1_000_000_000


class Counts(NamedTuple):
    """What the model reads of the recorder and its ring when it runs."""

    #: Cycles that ended (``Recorder.enqueued``).
    enqueued: int
    #: The worker's ns in CUDA acceptance copies so far (``Recorder.copy_ns``).
    copy_ns: int
    #: The sampling interval in effect.
    interval: int
    #: Whether the interval adapts (no fixed ``sample_every``).
    adaptive: bool
    #: What one phase boundary costs the worker (ns), and the phases per cycle.
    boundary_ns: float
    nphases: int
    #: Whether the native core starts the CUDA acceptance copies (their time then counts).
    native_copies: bool


class Reading(NamedTuple):
    """What one run of the model answers."""

    #: The sampling interval from now on; ``None``: leave it as it is.
    interval: int | None
    #: The self-reported overhead ratio; ``None``: no cycle time known yet.
    overhead: float | None
    #: The hot-path cost of one sampled cycle in the figures of this run (seconds; 0: none).
    cost_seconds: float


class OverheadModel:
    """The sampler's moving averages, and the figures gathered since it last ran."""

    def __init__(self, budget: float, now: int) -> None:
        #: The overhead budget (a fraction of cycle time) the interval keeps within.
        self.budget = budget
        #: When the model runs next (``perf_counter_ns``); the resolver's common chunk compares
        #: it inline.
        self.due = 0
        #: Figures since the last run: cost, sampled cycles, cycles' host ns, cycles, read ns.
        #: The resolver's common chunk adds its host ns and cycles inline.
        self.pending = [0, 0, 0, 0, 0]
        #: Since when (``perf_counter_ns``) the resolver's CPU gathers in ``cpu_acc``, the CPU
        #: not yet turned into a per-cycle figure; ``cpu_from``: the cycle count it gathers from.
        self.cpu_since = now
        self.reset(0, 0)

    def reset(self, enqueued: int, copy_ns: int) -> None:
        """Forget the averages; count cycles and copy time from these totals (a forked child:
        what the recorder counted before the fork is the parent's)."""
        self.cost_ewma = 0.0  # worker ns recording one sampled cycle's events
        self.cycle_ewma = 0.0  # host ns of one cycle
        self.copy_ewma = 0.0  # worker ns per cycle starting CUDA acceptance copies
        self.read_ewma = 0.0  # resolver ns reading one sampled cycle's events
        self.record_ns = 0.0  # resolver CPU under the GIL per cycle that ended
        self.cpu_acc = 0
        self.copy_seen = copy_ns
        self.enqueued_seen = self.cpu_from = enqueued

    def add_cpu(self, ns: int) -> None:
        """The resolver's thread CPU under the GIL, for the per-cycle figure."""
        self.cpu_acc += ns

    def gather(
        self, cost: int, n_sampled: int, total_ns: int, n: int, read_ns: int, now: int
    ) -> tuple[int, int, float, int] | None:
        """One chunk's figures: the hot-path cost of its sampled cycles, how many, its cycles'
        host ns, how many cycles, the resolver's ns reading sampled cycles. Returns what
        :meth:`run` takes, summed since it last ran, once it is due; else ``None``."""
        p = self.pending
        p[0] += cost
        p[1] += n_sampled
        p[2] += total_ns
        p[3] += n
        p[4] += read_ns
        if now < self.due:
            return None
        self.due = now + ADAPT_EVERY_NS
        self.pending = [0, 0, 0, 0, 0]
        return p[0], p[1], p[2] / p[3] if p[3] else 0.0, p[4]

    def run(
        self, cost: int, n_sampled: int, mean_cycle: float, read_ns: int, counts: Counts, now: int
    ) -> Reading:
        """Update the averages from figures :meth:`gather` summed, and answer the interval and
        the overhead.

        A sampled cycle costs the worker its event records (``cost``) and the resolver's reads
        of its events (``read_ns``): the resolver shares the GIL with the worker, and inside a
        GPU loop each CUDA runtime call costs it microseconds. Both count against the budget.
        """
        self._cpu_per_cycle(counts.enqueued, now)
        self.cycle_ewma = sampling.smoothed(self.cycle_ewma, mean_cycle)
        cycles = counts.enqueued - self.enqueued_seen
        if cycles > 0:
            per_copy = (counts.copy_ns - self.copy_seen) / cycles
            self.copy_ewma = sampling.smoothed(self.copy_ewma, per_copy) if per_copy else (
                self.copy_ewma * 0.8)
            self.copy_seen = counts.copy_ns
            self.enqueued_seen = counts.enqueued
        if n_sampled:
            self.cost_ewma = sampling.smoothed(self.cost_ewma, cost / n_sampled)
            self.read_ewma = sampling.smoothed(self.read_ewma, read_ns / n_sampled)
        interval: int | None = None
        if counts.adaptive and self.cost_ewma > 0:
            interval = sampling.adaptive_interval(
                self.cost_ewma + self.read_ewma, self.cycle_ewma, self.budget)
        in_effect = max(1, int(counts.interval if interval is None else interval))
        return Reading(interval, self.overhead(in_effect, counts),
                       cost / 1e9 if n_sampled else 0.0)

    def _cpu_per_cycle(self, enqueued: int, now: int) -> None:
        """Move the resolver's CPU per cycle, once enough cycles ended or enough time passed.

        Per cycle that ended, not per record a slice took: the native pump hands most cycles
        on with the GIL let go, so a slice that took a few records (a flush's) would make its
        fixed cost a per-record figure many times the real one."""
        ended = enqueued - self.cpu_from
        if ended >= RESOLVER_FIGURE_CYCLES or (
                ended > 0 and now - self.cpu_since >= RESOLVER_FIGURE_NS):
            self.record_ns = sampling.smoothed(self.record_ns, self.cpu_acc / ended)
            self.cpu_acc = 0
            self.cpu_from = enqueued
            self.cpu_since = now

    def overhead(self, interval: int, counts: Counts) -> float | None:
        """What the worker loses per cycle, as a fraction of cycle time (``None``: no cycle
        time yet).

        Event records on sampled cycles, host stamps (an estimate per boundary), and the
        resolver's CPU per cycle while it holds the GIL, which the worker shares (what the
        native core walks with the GIL let go costs the worker nothing). CUDA acceptance copies
        the native core starts hold the GIL through two runtime calls: their time is the
        worker's own, and counts. Copies through torch let go of the GIL inside and mostly wait
        to get it back from the resolver, whose term counts that already."""
        if self.cycle_ewma <= 0:
            return None
        per_cycle = (
            self.cost_ewma / max(interval, 1)
            + counts.boundary_ns * (counts.nphases + 1)
            + self.record_ns
            + (self.copy_ewma if counts.native_copies else 0.0)
        )
        return per_cycle / self.cycle_ewma


class CpuLedger:
    """The CPU specobs spent that the aggregation has not been told of yet: the resolver's
    thread, the native pump (with the GIL let go), and the worker's CUDA acceptance copies."""

    def __init__(self) -> None:
        #: The resolver's thread CPU not yet added (ns).
        self.pending = 0
        #: The ring's pump CPU, and the worker's copy time, as last added (ns).
        self.pump_seen = 0
        self.copy_added = 0

    def reset(self, copy_ns: int) -> None:
        """A forked child: the copy time counted so far is the parent's."""
        self.copy_added = copy_ns

    def take(self, pump_ns: int, copy_ns: int) -> tuple[int, int]:
        """What to add now, from the pump's and the copies' running totals: the resolver's ns
        (its thread and the pump's), and the worker's copy ns."""
        pending, self.pending = self.pending, 0
        pending += pump_ns - self.pump_seen
        self.pump_seen = pump_ns
        copied = 0
        if copy_ns > self.copy_added:
            copied = copy_ns - self.copy_added
            self.copy_added = copy_ns
        return pending, copied
