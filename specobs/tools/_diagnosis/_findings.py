"""The findings model every classifier returns (:class:`Finding`, :data:`CODES`,
:data:`SEVERITIES`), its input (:class:`Window`, one measured interval) and what every
classifier reads from a breakdown the same way (the clock to judge by, a phase's mean). The
words of a finding are rendered from its data in ``_words``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from specobs import catalog
from specobs.tools._breakdown import Breakdown, breakdown
from specobs.tools._diagnosis._thresholds import MIN_CLOCK_CYCLES, used_by
from specobs.tools._scrape import Delta

__all__ = ["CODES", "SEVERITIES", "Finding", "Window", "window", "worst"]

SEVERITIES: tuple[str, ...] = ("ok", "info", "warn", "fail")
"""Severities from best to worst."""


#: The numbers (and labels) a finding rests on, by name.
Evidence = dict[str, float | str | None]


@dataclass(frozen=True)
class Finding:
    """One conclusion: a stable ``code``, a ``severity`` (:data:`SEVERITIES`), one ``sentence`` a
    person understands, the ``evidence`` numbers it rests on and what to look at or change. The
    classifiers decide the code, severity and evidence; ``_words.found`` renders the sentence
    and the advice from them."""

    code: str
    severity: str
    sentence: str
    evidence: Evidence = field(default_factory=dict)
    advice: str = ""

    @property
    def thresholds(self) -> dict[str, float]:
        """The thresholds that decide this finding's code, by name (``_thresholds``)."""
        return used_by(self.code)


#: Every code a classifier returns, with its one-line meaning (docs/diagnosis.md has the rest).
CODES: dict[str, str] = {
    "SPEC-ACCEPT-HEALTHY": "conditional acceptance starts high and decays slowly",
    "SPEC-ACCEPT-CHAIN-SHORT": "the draft loses the target after a few positions",
    "SPEC-ACCEPT-COLLAPSE": "the draft disagrees with the target from its first token",
    "SPEC-ACCEPT-FLAT-LOW": "acceptance is low at every position",
    "SPEC-ACCEPT-LOW": "acceptance is low (one position: no profile to read)",
    "SPEC-ACCEPT-UNKNOWN": "too few drafted tokens to judge acceptance",
    "SPEC-CYCLE-VERIFY-BOUND": "verify takes most of the cycle",
    "SPEC-CYCLE-DRAFT-BOUND": "the draft takes most of the cycle",
    "SPEC-CYCLE-BOOKKEEPING-BOUND": "bookkeeping takes a large share of the cycle",
    "SPEC-CYCLE-BALANCED": "no phase dominates the cycle",
    "SPEC-CYCLE-UNKNOWN": "no clock with enough cycles to read the phase shares",
    "SPEC-HOST-BOUND": "the host cycle exceeds the GPU phases: the GPU waits for the host",
    "SPEC-HOST-LOCKSTEP": "host and GPU meet at every phase boundary: no overlap",
    "SPEC-HOST-OVERLAPPED": "the host runs ahead of the GPU",
    "SPEC-HOST-UNSEEN": "no GPU clock: host-boundness cannot be measured",
    "SPEC-STALL": "requests are waiting or running and no cycle completes",
    "SPEC-IDLE": "no cycles and no requests",
    "SPEC-NO-CYCLES": "no cycles, and no request gauges to tell idle from stalled",
    "SPEC-SPEEDUP-OK": "speculation is faster than the non-speculative baseline",
    "SPEC-SPEEDUP-LOSS": "speculation is slower than the baseline, with the reason",
    "SPEC-SPEEDUP-WARMING": "slower than the baseline while acceptance is still rising",
    "SPEC-SPEEDUP-UNKNOWN": "no baseline or too short a window to judge the speedup",
    "SPEC-RECENT-ACCEPT-DOWN": "acceptance fell in the recent window",
    "SPEC-RECENT-PHASE-SLOWER": "one phase got slower in the recent window",
    "SPEC-RECENT-BOUNDARY-COST": "several phases slower by the same time: a cost per boundary",
    "SPEC-RECENT-SLOWER-ALL": "every phase slower by the same factor: the machine or the batch",
    "SPEC-RECENT-HOST-BUSY": "the phases gained what the engine's thread waited for a CPU",
    "SPEC-RECENT-THROUGHPUT-DOWN": "per-sequence tokens/s fell in the recent window",
    "SPEC-RECENT-STEADY": "the recent window matches the lifetime",
    "SPEC-SAVED-ACCEPT-DOWN": "acceptance below a run saved earlier",
    "SPEC-SAVED-PHASE-SLOWER": "one phase slower than in a run saved earlier",
    "SPEC-SAVED-BOUNDARY-COST": "several phases slower than in a saved run by the same time",
    "SPEC-SAVED-SLOWER-ALL": "every phase slower than in a saved run by the same factor",
    "SPEC-SAVED-HOST-BUSY": "the phases gained, against a saved run, what the thread waited",
    "SPEC-SAVED-THROUGHPUT-DOWN": "per-sequence tokens/s below a run saved earlier",
    "SPEC-SAVED-STEADY": "the recent window matches a run saved earlier",
    "SPEC-COHORT-ACCEPT-BELOW": "acceptance below the other servers of the model and engine",
    "SPEC-COHORT-PHASE-SLOWER": "a phase slower than on the other servers of the model",
    "SPEC-COHORT-MATCHES": "the server matches the other servers of its model and engine",
    "SPEC-ADVICE-K": "the speculation length k the measured acceptance and costs favour",
    "SPEC-ADVICE-BATCH": "the batch size above which speculation stops paying",
    "SPEC-ADVICE-SCHEDULE": "the speculation length for each band of batch sizes",
    "SPEC-DRAFT-COSTLY": "the draft eats most of what speculation would gain",
    "SPEC-DRAFT-COST": "the draft's cost against a verify and a plain target step",
    "SPEC-GAP-HIGH": "the engine spends a large share of its busy time between cycles",
    "SPEC-GAP-OK": "the time between cycles is a small share of the engine's busy time",
}


def worst(findings: Iterable[Finding]) -> str:
    """The worst severity among ``findings`` (``"ok"`` for none)."""
    return max((f.severity for f in findings), key=SEVERITIES.index, default="ok")


# -- the input ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One measured interval: its breakdown and the gauges at its end."""

    breakdown: Breakdown
    requests_running: float | None = None
    requests_waiting: float | None = None
    last_cycle_age_seconds: float | None = None
    #: Drafted tokens at the first draft position (sequence-cycles that drafted).
    drafted_first: float | None = None
    #: The baseline was measured by the engine on the served batch (its ``source`` label says
    #: so), not configured: its step time is a plain forward of this batch (:func:`forward_cost`).
    baseline_measured: bool = False


def window(delta: Delta, now_seconds: float | None = None) -> Window:
    """The :class:`Window` of ``delta``; ``now_seconds`` (wall clock) dates the last cycle."""
    g = delta.gauges
    last = g.total(catalog.LAST_CYCLE_TIMESTAMP.name)
    age = None if last is None or not last > 0 or now_seconds is None else now_seconds - last
    sources = {d.get("source") or catalog.BASELINE_SOURCE_CONFIGURED
               for d in g.labels(catalog.BASELINE_SEQUENCE_TOKENS.name)}
    return Window(
        breakdown=breakdown(delta),
        requests_running=g.total(catalog.REQUESTS_RUNNING.name),
        requests_waiting=g.total(catalog.REQUESTS_WAITING.name),
        last_cycle_age_seconds=age,
        drafted_first=delta.counters.total(catalog.DRAFTED_BY_POSITION.name, position="0"),
        baseline_measured=bool(sources) and catalog.BASELINE_SOURCE_CONFIGURED not in sources,
    )


def _clock(b: Breakdown) -> str | None:
    """The clock whose phase shares tell where the cycle goes: the GPU's when it timed enough
    cycles (host timestamps under CUDA graphs book the GPU's time into whichever phase
    synchronizes), else the host's."""
    for clock in ("gpu", "host"):
        if b.cycle_counts.get(clock, 0.0) >= MIN_CLOCK_CYCLES:
            return clock
    return None


def _mean(b: Breakdown, phase: str, clock: str) -> float | None:
    s = b.stats.get((phase, clock))
    return None if s is None else s.mean_seconds
