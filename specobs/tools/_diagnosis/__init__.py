"""What is wrong with the speculation, in words: pure functions from measured intervals to
:class:`Finding` s, for ``specobs doctor``, ``specobs top``'s status line, the report's findings
section and the runbook (docs/diagnosis.md describes every code, its evidence and thresholds).

The input is one :class:`Window` per interval: the cycle breakdown of that interval
(:func:`specobs.tools._breakdown.breakdown` of two scrapes, of a Prometheus server's
``increase()`` window, or of two in-process snapshots) and the gauges read at its end. A bare
/metrics endpoint holds lifetime counters, so the first scrape is the endpoint's own past: the
diagnosis compares the recent window with the lifetime before it (:func:`against_past`).

Each classifier returns findings and never raises; a quantity it needs and the data does not
hold makes an ``info`` finding that says what is missing, never a guess. Severities, in order:

=======  ==================================================================================
ok       measured and healthy
info     worth knowing, nothing to change (or not enough data to judge)
warn     a problem to look at: speculation works but loses time or acceptance somewhere
fail     speculation is broken or costs throughput: a stall, a collapsed draft, slower than
         the baseline
=======  ==================================================================================

The thresholds are module constants named after what they bound; docs/diagnosis.md says how
each was chosen. The parts, each name importable from here:

==============  ===============================================================================
``_findings``   :class:`Finding`, :data:`CODES`, :data:`SEVERITIES`, :class:`Window`, and what
                every classifier reads alike (the clock to judge by, a phase's mean)
``_window``     the classifiers of one window: acceptance profile, cycle and host bound, stall,
                speedup
``_compare``    against a past (:data:`LIFETIME` or a :func:`saved_run`) and against a cohort
``_advice``     the advisor: k, the forward's cost in tokens, the batch threshold
==============  ===============================================================================
"""

from __future__ import annotations

from collections.abc import Sequence

from specobs.tools._diagnosis._advice import (
    ADVICE_MAX_K,
    ADVICE_MIN_GAIN,
    BATCH_CONFIDENT_FACTOR,
    BATCH_EXTRAPOLATION_MAX,
    BATCH_FIT_POINTS,
    BATCH_SAME_FACTOR,
    BATCH_SEARCH_MAX_FACTOR,
    DRAFT_FIXED_STEPS,
    TREND_MIN_RATES,
    BatchPoint,
    FirstPosition,
    ForwardCost,
    advise_k,
    batch_point,
    batch_threshold,
    draft_fixed,
    expected_tokens,
    extended_rates,
    forward_cost,
    line_threshold,
    verify_scaling,
)
from specobs.tools._diagnosis._compare import (
    ACCEPT_DROP_MIN,
    ACCEPT_DROP_Z,
    BOUNDARY_SPREAD,
    COHORT_BATCH_TOLERANCE,
    COHORT_PHASE_RATIO,
    DOMINANT_FRACTION,
    EVERY_PHASE_MIN_RATIO,
    HOST_WAIT_EXPLAINS,
    LIFETIME,
    MACHINE_SPREAD,
    MIN_PAST_CYCLES,
    MIN_RECENT_CYCLES,
    NOT_THE_SPECULATION,
    SLOWER_CYCLE_FRACTION,
    SLOWER_RATIO,
    SLOWER_Z,
    THROUGHPUT_DROP,
    UNIFORM_MIN_SHARE,
    UNIFORM_SPREAD,
    Reference,
    against_cohort,
    against_past,
    saved_run,
    shift_z,
)
from specobs.tools._diagnosis._findings import (
    CODES,
    MIN_CLOCK_CYCLES,
    SEVERITIES,
    Finding,
    Window,
    window,
    worst,
)
from specobs.tools._diagnosis._window import (
    BOOKKEEPING_MAX_SHARE,
    BOUND_SHARE,
    CHAIN_MIN,
    COLLAPSE_RECOVERY,
    FIRST_POSITION_MIN,
    HOST_GAP_MIN,
    LOCKSTEP_MAX,
    MIN_DRAFTED_TOKENS,
    MIN_SPEEDUP_CYCLES,
    WARMING_RISE_MIN,
    acceptance_profile,
    conditional_acceptance,
    cycle_bound,
    host_bound,
    speedup,
    stall,
)

__all__ = [
    "ACCEPT_DROP_MIN",
    "ACCEPT_DROP_Z",
    "ADVICE_MAX_K",
    "ADVICE_MIN_GAIN",
    "BATCH_CONFIDENT_FACTOR",
    "BATCH_EXTRAPOLATION_MAX",
    "BATCH_FIT_POINTS",
    "BATCH_SAME_FACTOR",
    "BATCH_SEARCH_MAX_FACTOR",
    "BOOKKEEPING_MAX_SHARE",
    "BOUNDARY_SPREAD",
    "BOUND_SHARE",
    "CHAIN_MIN",
    "CODES",
    "COHORT_BATCH_TOLERANCE",
    "COHORT_PHASE_RATIO",
    "COLLAPSE_RECOVERY",
    "DOMINANT_FRACTION",
    "DRAFT_FIXED_STEPS",
    "EVERY_PHASE_MIN_RATIO",
    "FIRST_POSITION_MIN",
    "HOST_GAP_MIN",
    "HOST_WAIT_EXPLAINS",
    "LIFETIME",
    "LOCKSTEP_MAX",
    "MACHINE_SPREAD",
    "MIN_CLOCK_CYCLES",
    "MIN_DRAFTED_TOKENS",
    "MIN_PAST_CYCLES",
    "MIN_RECENT_CYCLES",
    "MIN_SPEEDUP_CYCLES",
    "NOT_THE_SPECULATION",
    "SEVERITIES",
    "SLOWER_CYCLE_FRACTION",
    "SLOWER_RATIO",
    "SLOWER_Z",
    "THROUGHPUT_DROP",
    "TREND_MIN_RATES",
    "UNIFORM_MIN_SHARE",
    "UNIFORM_SPREAD",
    "WARMING_RISE_MIN",
    "BatchPoint",
    "Finding",
    "FirstPosition",
    "ForwardCost",
    "Reference",
    "Window",
    "acceptance_profile",
    "advise_k",
    "against_cohort",
    "against_past",
    "batch_point",
    "batch_threshold",
    "conditional_acceptance",
    "cycle_bound",
    "diagnose",
    "draft_fixed",
    "expected_tokens",
    "extended_rates",
    "forward_cost",
    "host_bound",
    "line_threshold",
    "saved_run",
    "shift_z",
    "speedup",
    "stall",
    "status_line",
    "verify_scaling",
    "window",
    "worst",
]


# -- everything -----------------------------------------------------------------------------------


def diagnose(recent: Window, past: Window | None = None,
             batch_windows: Sequence[Window] = ()) -> list[Finding]:
    """Every finding for ``recent``, and against ``past`` (the lifetime before it) when given.
    ``batch_windows``: other windows of the same server (the report's windows, ``top``'s
    intervals, a Prometheus range), each with a baseline measured at its end, from which the
    batch threshold is fitted over the batch sizes served, not only ``recent``'s. A stall is the
    only finding when there is one: nothing else was measured."""
    b = recent.breakdown
    stalled = stall(recent)
    if stalled is not None:
        return [stalled]
    out = [
        acceptance_profile(b, recent.drafted_first),
        cycle_bound(b),
        host_bound(b),
        speedup(b, past.breakdown if past is not None else None),
    ]
    if past is not None:
        pair = None
        if past.drafted_first is not None and recent.drafted_first is not None:
            pair = (past.drafted_first, recent.drafted_first)
        out.extend(against_past(b, past.breakdown, pair))
    if b.cycles >= MIN_SPEEDUP_CYCLES:
        # A baseline measured on the served batch is a plain forward of it: with verify it
        # tells how the forward's cost grows with tokens (a configured one may be anything).
        plain = None
        if recent.baseline_measured and b.baseline_tokens_per_second:
            plain = 1.0 / b.baseline_tokens_per_second
        advice = advise_k(b, verify_scaling(forward_cost(b, plain)))
        if advice is not None:
            out.append(advice)
        # The lifetime is not a point: its baseline gauge was read at its end, on the batch
        # served then, not on the lifetime's mean batch.
        points = [p for w in (recent, *batch_windows)
                  if w.breakdown.cycles >= MIN_SPEEDUP_CYCLES
                  and (p := batch_point(w)) is not None]
        threshold = batch_threshold(points)
        if threshold is not None:
            out.append(threshold)
    return out


def status_line(findings: Sequence[Finding]) -> str:
    """One line for ``specobs top``: the worst severity and its findings' codes."""
    level = worst(findings)
    bad = [f.code for f in findings if f.severity == level and level in ("warn", "fail")]
    if not bad:
        return "OK: no problem found"
    return f"{level.upper()}: " + ", ".join(bad)

