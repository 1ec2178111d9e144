"""Every threshold the diagnosis decides with, in one table (:data:`THRESHOLDS`).

Each entry has its value, its unit, what it bounds, and the codes of the findings it decides.
The classifiers import the values by name from here. ``specobs generate`` renders the table
into docs/diagnosis.md (:func:`doc_region`), and ``specobs generate --check`` fails when the
doc drifts from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

__all__ = ["BEGIN", "DOC_PATH", "END", "THRESHOLDS", "Threshold", "doc_region", "used_by"]

_N = TypeVar("_N", int, float)


@dataclass(frozen=True)
class Threshold:
    """One row of the table."""

    name: str
    value: float
    unit: str
    meaning: str
    #: The codes of the findings it decides.
    codes: tuple[str, ...]


#: The table, in the order of docs/diagnosis.md's sections.
THRESHOLDS: dict[str, Threshold] = {}


def _entry(name: str, value: _N, unit: str, meaning: str, *codes: str) -> _N:
    """Add one row to :data:`THRESHOLDS`; return its value for the module constant."""
    THRESHOLDS[name] = Threshold(name, float(value), unit, meaning, codes)
    return value


def _past(*suffixes: str) -> tuple[str, ...]:
    """The codes of a comparison with the past: the lifetime's and a saved run's."""
    return tuple(f"SPEC-{ref}-{s}" for s in suffixes for ref in ("RECENT", "SAVED"))


_ACCEPT = ("SPEC-ACCEPT-UNKNOWN", "SPEC-ACCEPT-LOW", "SPEC-ACCEPT-COLLAPSE",
           "SPEC-ACCEPT-FLAT-LOW", "SPEC-ACCEPT-CHAIN-SHORT", "SPEC-ACCEPT-HEALTHY")
_CYCLE = ("SPEC-CYCLE-VERIFY-BOUND", "SPEC-CYCLE-DRAFT-BOUND", "SPEC-CYCLE-BOOKKEEPING-BOUND",
          "SPEC-CYCLE-BALANCED")
_SPEEDUP = ("SPEC-SPEEDUP-OK", "SPEC-SPEEDUP-LOSS", "SPEC-SPEEDUP-WARMING",
            "SPEC-SPEEDUP-UNKNOWN")
_SLOWER = _past("PHASE-SLOWER", "BOUNDARY-COST", "SLOWER-ALL")

# -- shared ---------------------------------------------------------------------------------------

MIN_CLOCK_CYCLES = _entry(
    "MIN_CLOCK_CYCLES", 10.0, "cycles",
    "cycles a clock needs in the interval before its phase shares are used",
    "SPEC-CYCLE-UNKNOWN", *_CYCLE, "SPEC-HOST-UNSEEN", "SPEC-GAP-HIGH", "SPEC-GAP-OK")

# -- one window -----------------------------------------------------------------------------------

MIN_DRAFTED_TOKENS = _entry(
    "MIN_DRAFTED_TOKENS", 200.0, "tokens",
    "drafted tokens at the first position below which the acceptance profile is not classified",
    *_ACCEPT)
FIRST_POSITION_MIN = _entry(
    "FIRST_POSITION_MIN", 0.6, "rate",
    "conditional acceptance at the first position below which the draft is called broken or "
    "weak", *_ACCEPT[1:])
COLLAPSE_RECOVERY = _entry(
    "COLLAPSE_RECOVERY", 0.15, "rate",
    "a collapse: the later positions' conditional acceptance at least this far above the "
    "first's", "SPEC-ACCEPT-COLLAPSE", "SPEC-ACCEPT-FLAT-LOW")
CHAIN_MIN = _entry(
    "CHAIN_MIN", 0.5, "rate",
    "a later position whose conditional acceptance falls below this ends the useful chain",
    "SPEC-ACCEPT-CHAIN-SHORT", "SPEC-ACCEPT-HEALTHY")
BOUND_SHARE = _entry(
    "BOUND_SHARE", 0.6, "share of the cycle",
    "the phase share above which a cycle is called bound by that phase", *_CYCLE)
BOOKKEEPING_MAX_SHARE = _entry(
    "BOOKKEEPING_MAX_SHARE", 0.25, "share of the cycle",
    "bookkeeping share (on the clock used) above which bookkeeping is a problem", *_CYCLE)
HOST_GAP_MIN = _entry(
    "HOST_GAP_MIN", 0.15, "share of the host cycle",
    "the host cycle above the GPU phases' sum by this share of it: host-bound",
    "SPEC-HOST-BOUND", "SPEC-HOST-LOCKSTEP", "SPEC-HOST-OVERLAPPED")
LOCKSTEP_MAX = _entry(
    "LOCKSTEP_MAX", 0.05, "share of the host cycle",
    "host and GPU per-phase means within this share of the cycle, summed over the phases: "
    "they meet at every phase boundary (no overlap)", "SPEC-HOST-LOCKSTEP",
    "SPEC-HOST-OVERLAPPED")
MIN_SPEEDUP_CYCLES = _entry(
    "MIN_SPEEDUP_CYCLES", 50.0, "cycles",
    "cycles in the interval below which a speedup is not judged (nor advice read)",
    *_SPEEDUP, "SPEC-ADVICE-K", "SPEC-ADVICE-BATCH", "SPEC-ADVICE-SCHEDULE",
    "SPEC-DRAFT-COSTLY", "SPEC-DRAFT-COST")
WARMING_RISE_MIN = _entry(
    "WARMING_RISE_MIN", 0.05, "rate",
    "acceptance up by this much over the lifetime: the draft is still warming up",
    "SPEC-SPEEDUP-WARMING", "SPEC-SPEEDUP-LOSS")
GAP_MAX_SHARE = _entry(
    "GAP_MAX_SHARE", 0.10, "share of a cycle and its gap",
    "the engine's steady time between cycles above this share: time outside the cycles costs "
    "tokens/s", "SPEC-GAP-HIGH", "SPEC-GAP-OK")
GAP_GREW = _entry(
    "GAP_GREW", 1.5, "factor",
    "a gap this many times the past's is named as grown", "SPEC-GAP-HIGH", "SPEC-GAP-OK")
GAP_SKEW = _entry(
    "GAP_SKEW", 3.0, "factor",
    "a mean gap above this multiple of the median: idle waits skew it, the median is the "
    "steady gap", "SPEC-GAP-HIGH", "SPEC-GAP-OK")

# -- against a past and a cohort ------------------------------------------------------------------

MIN_PAST_CYCLES = _entry(
    "MIN_PAST_CYCLES", 100.0, "cycles",
    "cycles the past (the lifetime before the window, or a saved run) needs to compare",
    *_past("ACCEPT-DOWN", "PHASE-SLOWER", "BOUNDARY-COST", "SLOWER-ALL", "HOST-BUSY",
           "THROUGHPUT-DOWN", "STEADY"))
MIN_RECENT_CYCLES = _entry(
    "MIN_RECENT_CYCLES", 20.0, "cycles",
    "cycles the recent window needs to be compared with its past",
    *_past("ACCEPT-DOWN", "PHASE-SLOWER", "BOUNDARY-COST", "SLOWER-ALL", "HOST-BUSY",
           "THROUGHPUT-DOWN", "STEADY"))
ACCEPT_DROP_MIN = _entry(
    "ACCEPT_DROP_MIN", 0.10, "rate",
    "acceptance down by at least this much (absolute) for a finding",
    *_past("ACCEPT-DOWN"), "SPEC-COHORT-ACCEPT-BELOW")
ACCEPT_DROP_Z = _entry(
    "ACCEPT_DROP_Z", 4.0, "standard errors",
    "... and by at least this z score where the drafted counts give one",
    *_past("ACCEPT-DOWN"), "SPEC-COHORT-ACCEPT-BELOW")
SLOWER_RATIO = _entry(
    "SLOWER_RATIO", 1.25, "factor",
    "a phase slower than its past mean by this factor is slower", *_SLOWER)
SLOWER_CYCLE_FRACTION = _entry(
    "SLOWER_CYCLE_FRACTION", 0.10, "share of the past cycle",
    "... and by at least this share of the past cycle", *_SLOWER)
SLOWER_Z = _entry(
    "SLOWER_Z", 4.0, "standard errors",
    "... and by this many standard errors of the difference of the two means, where the "
    "histograms give a spread: a few slow cycles in distant buckets are not a slower phase",
    *_SLOWER)
UNIFORM_MIN_SHARE = _entry(
    "UNIFORM_MIN_SHARE", 0.01, "share of the past cycle",
    "the phases at least this large are the ones the whole machine's slowdown is read from",
    *_SLOWER)
UNIFORM_SPREAD = _entry(
    "UNIFORM_SPREAD", 1.5, "factor",
    "those phases slowed by factors within this of each other: the whole machine slowed",
    *_SLOWER)
EVERY_PHASE_MIN_RATIO = _entry(
    "EVERY_PHASE_MIN_RATIO", 1.15, "factor",
    "or every one of them slowed by at least this factor ...", *_SLOWER)
MACHINE_SPREAD = _entry(
    "MACHINE_SPREAD", 2.5, "factor",
    "... with factors within this of each other (a host preempting the engine's thread "
    "lengthens a short phase by more than a long one)", *_SLOWER)
HOST_WAIT_EXPLAINS = _entry(
    "HOST_WAIT_EXPLAINS", 0.5, "share of the added time",
    "the recording thread waited for a CPU at least this share of the time the phases gained: "
    "other work on the host is where that time went", *_past("HOST-BUSY"), *_SLOWER)
BOUNDARY_SPREAD = _entry(
    "BOUNDARY_SPREAD", 1.5, "factor",
    "slowed phases whose added times are within this factor of each other: one cost per "
    "boundary", *_SLOWER)
DOMINANT_FRACTION = _entry(
    "DOMINANT_FRACTION", 0.5, "share of the largest factor",
    "slowed phases reported on their own: those slowed by at least this share of the largest "
    "factor", *_past("PHASE-SLOWER"))
THROUGHPUT_DROP = _entry(
    "THROUGHPUT_DROP", 0.8, "share of the past",
    "per-sequence tokens/s below this share of the past: throughput down",
    *_past("THROUGHPUT-DOWN"))
THROUGHPUT_SEVERE = _entry(
    "THROUGHPUT_SEVERE", 0.4, "share of the past",
    "a fall below this share is a warning even when no speculation finding explains it",
    *_past("THROUGHPUT-DOWN"))
COHORT_PHASE_RATIO = _entry(
    "COHORT_PHASE_RATIO", 1.5, "factor",
    "a phase this many times the cohort's mean is slower (the PhaseLatencyAboveCohort alert's "
    "default)", "SPEC-COHORT-PHASE-SLOWER", "SPEC-COHORT-MATCHES")
COHORT_BATCH_TOLERANCE = _entry(
    "COHORT_BATCH_TOLERANCE", 1.2, "factor",
    "... at a batch no larger than this many times the cohort's",
    "SPEC-COHORT-PHASE-SLOWER", "SPEC-COHORT-MATCHES")

# -- the cost model and the advisor ---------------------------------------------------------------

MIN_POINT_CYCLES = _entry(
    "MIN_POINT_CYCLES", 8.0, "cycles",
    "cycles a draft length needs in the window to be a point of the forward's cost fit",
    *_SPEEDUP, "SPEC-ADVICE-K", "SPEC-DRAFT-COST")
SAME_TOKENS = _entry(
    "SAME_TOKENS", 1.1, "factor",
    "points whose token counts are within this factor of each other are one point",
    *_SPEEDUP, "SPEC-ADVICE-K", "SPEC-DRAFT-COST")
DRAFT_FIXED_STEPS = _entry(
    "DRAFT_FIXED_STEPS", 0.5, "draft steps",
    "the draft's part that does not grow with k, where the host's draft time does not give it",
    "SPEC-ADVICE-K", "SPEC-DRAFT-COST", "SPEC-DRAFT-COSTLY")
CALIBRATION_TOLERANCE = _entry(
    "CALIBRATION_TOLERANCE", 0.10, "fraction",
    "predicted and realized speedups further apart than this, relatively, are explained",
    "SPEC-SPEEDUP-OK", "SPEC-SPEEDUP-LOSS")
ADVICE_MAX_K = _entry(
    "ADVICE_MAX_K", 8, "draft length",
    "the advisor considers k from 1 to this", "SPEC-ADVICE-K", "SPEC-ADVICE-SCHEDULE")
ADVICE_MIN_GAIN = _entry(
    "ADVICE_MIN_GAIN", 0.02, "fraction",
    "another k is named only for a predicted gain of at least this",
    "SPEC-ADVICE-K", "SPEC-ADVICE-SCHEDULE")
TREND_MIN_RATES = _entry(
    "TREND_MIN_RATES", 3, "positions",
    "beyond the measured positions, the in-cycle rates' trend is taken from at least this many "
    "of them; from fewer, their level alone", "SPEC-ADVICE-K", "SPEC-ADVICE-SCHEDULE")
ADVICE_Z = _entry(
    "ADVICE_Z", 1.0, "standard errors",
    "the advice's gain is judged at the pessimistic end of an interval this many standard "
    "errors of the conditional rates wide", "SPEC-ADVICE-K", "SPEC-ADVICE-SCHEDULE")
PLAIN_STEP_SPREAD = _entry(
    "PLAIN_STEP_SPREAD", 0.03, "fraction",
    "a plain step measured beside the cycles is trusted to this fraction: the forward's slope "
    "is judged at both ends of what that allows", "SPEC-ADVICE-K", "SPEC-ADVICE-SCHEDULE")
ADVICE_BEYOND = _entry(
    "ADVICE_BEYOND", 6, "positions",
    "positions beyond the measured ones the advisor extrapolates acceptance to",
    "SPEC-ADVICE-K", "SPEC-ADVICE-SCHEDULE")
ADVICE_ALIKE = _entry(
    "ADVICE_ALIKE", 0.02, "fraction",
    "lengths predicted within this of the best are alike: the one nearest the measured k is "
    "advised", "SPEC-ADVICE-K", "SPEC-ADVICE-SCHEDULE")
DRAFT_MAX_OF_VERIFY = _entry(
    "DRAFT_MAX_OF_VERIFY", 0.85, "share of a verify",
    "the draft is costly when it costs at least this share of a verify ...",
    "SPEC-DRAFT-COSTLY", "SPEC-DRAFT-COST")
DRAFT_EATS_GAIN = _entry(
    "DRAFT_EATS_GAIN", 0.75, "share of the gain",
    "... and eats at least this share of what speculation would gain with a free draft",
    "SPEC-DRAFT-COSTLY", "SPEC-DRAFT-COST")
DRAFT_GREW = _entry(
    "DRAFT_GREW", 1.5, "factor",
    "a draft whose cost a position grew by this factor against the past is named as grown",
    "SPEC-DRAFT-COSTLY", "SPEC-DRAFT-COST")

# -- the batch size and the schedule --------------------------------------------------------------

BATCH_SEARCH_MAX_FACTOR = _entry(
    "BATCH_SEARCH_MAX_FACTOR", 64.0, "factor",
    "batch sizes the threshold search looks at, as multiples of the largest batch observed",
    "SPEC-ADVICE-BATCH")
BATCH_SAME_FACTOR = _entry(
    "BATCH_SAME_FACTOR", 1.25, "factor",
    "windows whose mean batches are within this factor of each other are one batch size",
    "SPEC-ADVICE-BATCH", "SPEC-ADVICE-SCHEDULE")
BATCH_FIT_POINTS = _entry(
    "BATCH_FIT_POINTS", 3, "batch sizes",
    "the top batch sizes observed whose costs' log-log slopes extrapolate beyond them",
    "SPEC-ADVICE-BATCH")
BATCH_EXTRAPOLATION_MAX = _entry(
    "BATCH_EXTRAPOLATION_MAX", 4.0, "factor",
    "a threshold extrapolated beyond the largest batch observed is named only up to this "
    "factor of it", "SPEC-ADVICE-BATCH")
BATCH_CONFIDENT_FACTOR = _entry(
    "BATCH_CONFIDENT_FACTOR", 2.0, "factor",
    "an extrapolated threshold up to this factor has confidence medium, beyond it low",
    "SPEC-ADVICE-BATCH")


def used_by(code: str) -> dict[str, float]:
    """The thresholds that decide the finding ``code``: name -> value."""
    return {t.name: t.value for t in THRESHOLDS.values() if code in t.codes}


# -- the doc --------------------------------------------------------------------------------------

DOC_PATH = "docs/diagnosis.md"
BEGIN = ("<!-- BEGIN GENERATED: thresholds, from specobs/tools/_diagnosis/_thresholds.py "
         "(specobs generate; do not edit by hand) -->")
END = "<!-- END GENERATED: thresholds -->"


def _value(t: Threshold) -> str:
    return f"{t.value:g}"


def doc_region() -> str:
    """The thresholds table of docs/diagnosis.md, markers included, ending with a newline."""
    lines = [BEGIN, "",
             "| threshold | value | unit | what it bounds | findings it decides |",
             "| --- | --- | --- | --- | --- |"]
    for t in THRESHOLDS.values():
        codes = ", ".join(f"`{c}`" for c in t.codes)
        lines.append(f"| `{t.name}` | {_value(t)} | {t.unit} | {t.meaning} | {codes} |")
    lines += ["", END]
    return "\n".join(lines) + "\n"
