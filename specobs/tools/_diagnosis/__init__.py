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

A classifier decides a finding's code, severity and evidence; ``_words`` renders its sentence
and advice from them. The thresholds are one table, ``_thresholds``: each with its value, unit,
meaning and the findings it decides; docs/diagnosis.md lists them (generated) and says how each
was chosen. Import a threshold from ``_thresholds``, not from here. The parts:

==================  ==============================================================================
``_thresholds``     every threshold, in one documented table (``thresholds.ini``)
``_findings``       :class:`Finding`, :data:`CODES`, :data:`SEVERITIES`, :class:`Window`, and what
                    every classifier reads alike (the clock to judge by, a phase's mean)
``_words``          every finding's sentence and advice, rendered from its data
``_window``         the classifiers of one window: acceptance profile, cycle and host bound, stall,
                    speedup, time between cycles
``_compare``        against a past (:data:`LIFETIME` or a :func:`saved_run`) and against a cohort
``_cost``           the cost model: the forward's cost in tokens fitted from the server's own
                    points, a cycle's costs in host seconds
``_advice``         the advisor: k, the predicted speedup, the draft's cost
``_batch``          the batch size above which speculation stops paying
``_schedule``       a k for each band of batch sizes
``_engine_config``  such a schedule in each engine's own configuration syntax
==================  ==============================================================================
"""

from __future__ import annotations

from collections.abc import Sequence

from specobs.tools._diagnosis._advice import (
    FirstPosition,
    Prospects,
    advise_k,
    candidates,
    draft_cost,
    expected_tokens,
    extended_rates,
    nearest_best,
    predict,
    prospects,
    rate_interval,
    slopes,
)
from specobs.tools._diagnosis._batch import BatchPoint, batch_point, batch_threshold, line_threshold
from specobs.tools._diagnosis._compare import (
    LIFETIME,
    NOT_THE_SPECULATION,
    Reference,
    acceptance_against_past,
    against_cohort,
    against_past,
    saved_run,
    shift_z,
)
from specobs.tools._diagnosis._cost import (
    CostPoint,
    CycleCosts,
    ForwardModel,
    Prediction,
    cost_points,
    cycle_costs,
    draft_fixed,
    fit_forward,
)
from specobs.tools._diagnosis._engine_config import Band
from specobs.tools._diagnosis._findings import CODES, SEVERITIES, Finding, Window, window, worst
from specobs.tools._diagnosis._schedule import (
    BandChoice,
    bands_from,
    by_draft_length,
    choose_at,
    schedule,
    schedule_finding,
)
from specobs.tools._diagnosis._thresholds import (
    BATCH_SAME_FACTOR,
    MIN_PAST_CYCLES,
    MIN_RECENT_CYCLES,
    MIN_SPEEDUP_CYCLES,
)
from specobs.tools._diagnosis._window import (
    acceptance_profile,
    between_cycles,
    conditional_acceptance,
    cycle_bound,
    host_bound,
    speedup,
    stall,
)
from specobs.tools._diagnosis._words import found

__all__ = [
    "BATCH_SAME_FACTOR",
    "CODES",
    "ENGINE_CHANGED",
    "LIFETIME",
    "MIN_PAST_CYCLES",
    "MIN_RECENT_CYCLES",
    "MIN_SPEEDUP_CYCLES",
    "NOT_THE_SPECULATION",
    "SEVERITIES",
    "Band",
    "BandChoice",
    "BatchPoint",
    "CostPoint",
    "CycleCosts",
    "Finding",
    "FirstPosition",
    "ForwardModel",
    "Prediction",
    "Prospects",
    "Reference",
    "Window",
    "acceptance_against_past",
    "acceptance_profile",
    "advise_k",
    "against_cohort",
    "against_past",
    "bands_from",
    "batch_point",
    "batch_threshold",
    "between_cycles",
    "by_draft_length",
    "candidates",
    "choose_at",
    "conditional_acceptance",
    "cost_points",
    "cycle_bound",
    "cycle_costs",
    "diagnose",
    "diagnose_engine",
    "draft_cost",
    "draft_fixed",
    "expected_tokens",
    "extended_rates",
    "fit_forward",
    "host_bound",
    "line_threshold",
    "nearest_best",
    "predict",
    "prospects",
    "rate_interval",
    "saved_run",
    "schedule",
    "schedule_finding",
    "shift_z",
    "slopes",
    "speedup",
    "stall",
    "status_line",
    "window",
    "worst",
]


# -- everything -----------------------------------------------------------------------------------


def model_of(windows: Sequence[Window]) -> ForwardModel | None:
    """The forward's cost fitted on the points of ``windows`` (:func:`cost_points`)."""
    points = [p for w in windows for p in cost_points(w.breakdown, w.baseline_measured)]
    return fit_forward(points)


#: Recent changes of the engine itself, after which the advice is read from the recent window.
ENGINE_CHANGED = frozenset({"SPEC-RECENT-ACCEPT-DOWN", "SPEC-RECENT-PHASE-SLOWER",
                            "SPEC-RECENT-BOUNDARY-COST"})


def advice_basis(recent: Window, past: Window | None, compared: Sequence[Finding]) -> Window:
    """The window the advice and the draft's cost are read from: the lifetime before
    ``recent`` where the engine did not change in the recent window (none of
    :data:`ENGINE_CHANGED` found: a busy machine or a throughput dip is no reason to trust a few
    seconds over the lifetime) and the lifetime holds at least four times as many cycles, so
    that runs a few seconds apart advise alike; else ``recent``."""
    if past is None or past.breakdown.cycles < 4 * recent.breakdown.cycles:
        return recent
    if not compared or any(f.code in ENGINE_CHANGED for f in compared):
        return recent
    return past


def diagnose(recent: Window, past: Window | None = None,
             batch_windows: Sequence[Window] = ()) -> list[Finding]:
    """Every finding for ``recent``, and against ``past`` (the lifetime before it) when given.
    ``batch_windows``: other windows of the same server (the report's windows, ``top``'s
    intervals, a Prometheus range), each with a baseline measured at its end, from which the
    batch threshold and the k for each band of batch sizes are fitted over the batch sizes
    served, not only ``recent``'s. A stall is the only finding when there is one: nothing else
    was measured."""
    b = recent.breakdown
    stalled = stall(recent)
    if stalled is not None:
        return [stalled]
    compared: list[Finding] = []
    if past is not None:
        pair = None
        if past.drafted_first is not None and recent.drafted_first is not None:
            pair = (past.drafted_first, recent.drafted_first)
        compared = against_past(b, past.breakdown, pair)
    model = model_of([recent])
    out = [
        acceptance_profile(b, recent.drafted_first),
        cycle_bound(b),
        host_bound(b),
        speedup(b, past.breakdown if past is not None else None, predict(b, model)),
    ]
    out.extend(compared)
    gap = between_cycles(b, past.breakdown if past is not None else None)
    if gap is not None:
        out.append(gap)
    # The draft's cost and the advice are read from the same basis: a few seconds of a busy
    # machine swing the phases by half, the lifetime that matches them does not.
    basis = advice_basis(recent, past, compared)
    if basis.breakdown.cycles >= MIN_SPEEDUP_CYCLES:
        basis_model = model if basis is recent else model_of([basis])
        before = past.breakdown if past is not None and basis is recent else None
        costly = draft_cost(basis.breakdown, before, basis_model)
        if costly is not None:
            out.append(costly)
        advice = advise_k(basis.breakdown, basis_model, basis.drafted_first)
        if advice is not None:
            out.append(advice)
    if b.cycles >= MIN_SPEEDUP_CYCLES:
        # The lifetime is not a point: its baseline gauge was read at its end, on the batch
        # served then, not on the lifetime's mean batch.
        served = [w for w in (recent, *batch_windows) if w.breakdown.cycles >= MIN_SPEEDUP_CYCLES]
        points = [p for w in served if (p := batch_point(w)) is not None]
        threshold = batch_threshold(points)
        if threshold is not None:
            out.append(threshold)
        if batch_windows:
            at = threshold.evidence.get("extrapolated_batch") if threshold is not None else None
            bands, choices = schedule(served, [model_of([w]) for w in served],
                                      at if isinstance(at, float) else None)
            found = schedule_finding(bands, choices)
            if found is not None:
                out.append(found)
    return out


def diagnose_engine(recent: Window, past: Window | None, engine: str,
                    per_position: bool) -> list[Finding]:
    """The findings a server without specobs's plugin allows, from its engine's own series
    (``specobs.tools._engine_series``): the acceptance profile where the engine exports
    acceptance by draft position, and acceptance against ``past``. ``recent.drafted_first``
    holds the window's drafts. Cycles, phases and the speedup need the plugin: no finding is
    made of them (the tools say so beside the findings)."""
    b = recent.breakdown
    if per_position:
        out = [acceptance_profile(b, recent.drafted_first)]
    else:
        out = [found("SPEC-ACCEPT-UNKNOWN", "info", {"acceptance_rate": b.acceptance_rate},
                     "engine", engine=engine)]
    if past is not None and past.drafted_first is not None \
            and recent.drafted_first is not None:
        out.extend(acceptance_against_past(b, past.breakdown,
                                           (past.drafted_first, recent.drafted_first)))
    return out


def status_line(findings: Sequence[Finding]) -> str:
    """One line for ``specobs top``: the worst severity and its findings' codes."""
    level = worst(findings)
    bad = [f.code for f in findings if f.severity == level and level in ("warn", "fail")]
    if not bad:
        return "OK: no problem found"
    return f"{level.upper()}: " + ", ".join(bad)

