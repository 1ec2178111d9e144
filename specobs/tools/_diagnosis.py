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
each was chosen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

from specobs import catalog
from specobs.tools._breakdown import Breakdown, breakdown, ratio, speedups
from specobs.tools._scrape import Delta

__all__ = [
    "CODES",
    "LIFETIME",
    "SEVERITIES",
    "Finding",
    "Reference",
    "Window",
    "acceptance_profile",
    "advise_k",
    "against_past",
    "batch_threshold",
    "conditional_acceptance",
    "cycle_bound",
    "diagnose",
    "expected_tokens",
    "forward_cost",
    "host_bound",
    "saved_run",
    "speedup",
    "stall",
    "status_line",
    "verify_scaling",
    "window",
    "worst",
]

SEVERITIES: tuple[str, ...] = ("ok", "info", "warn", "fail")
"""Severities from best to worst."""

# -- thresholds -----------------------------------------------------------------------------------

#: Drafted tokens at the first position below which the acceptance profile is not classified.
MIN_DRAFTED_TOKENS = 200.0
#: Conditional acceptance at the first position below which the draft is called broken or weak.
FIRST_POSITION_MIN = 0.6
#: A collapse: the later positions' conditional acceptance at least this far above the first's.
COLLAPSE_RECOVERY = 0.15
#: A later position whose conditional acceptance falls below this ends the useful chain.
CHAIN_MIN = 0.5
#: Cycles a clock needs in the interval before its phase shares are used.
MIN_CLOCK_CYCLES = 10.0
#: The phase share above which a cycle is called bound by that phase.
BOUND_SHARE = 0.6
#: Bookkeeping share (on the clock used) above which bookkeeping is a problem.
BOOKKEEPING_MAX_SHARE = 0.25
#: Host cycle above the GPU phases' sum by this fraction of the host cycle: host-bound.
HOST_GAP_MIN = 0.15
#: Host and GPU per-phase means within this fraction of the cycle, summed over the phases: the
#: host and the GPU meet at every phase boundary (no overlap).
LOCKSTEP_MAX = 0.05
#: Cycles in the interval below which a speedup is not judged.
MIN_SPEEDUP_CYCLES = 50.0
#: Cycles the past (the lifetime before the window) and the recent window each need to compare.
MIN_PAST_CYCLES = 100.0
MIN_RECENT_CYCLES = 20.0
#: Acceptance down by at least this much (absolute) and this z score: a finding.
ACCEPT_DROP_MIN = 0.10
ACCEPT_DROP_Z = 4.0
#: Acceptance up by this much: the draft is still warming up (training, a cache filling).
WARMING_RISE_MIN = 0.05
#: A phase slower than its past mean by this factor (and by this fraction of the past cycle).
SLOWER_RATIO = 1.25
SLOWER_CYCLE_FRACTION = 0.10
#: The whole machine slowed only if the phases holding at least UNIFORM_MIN_SHARE of the past
#: cycle slowed by factors within UNIFORM_SPREAD of each other.
UNIFORM_MIN_SHARE = 0.01
UNIFORM_SPREAD = 1.5
#: ... or, where one factor still fits at least as well as one added time, every one of those
#: phases slowed by at least EVERY_PHASE_MIN_RATIO and by factors within MACHINE_SPREAD of each
#: other: a host busy with other work preempts the engine's thread in slices of milliseconds,
#: which lengthens a short phase by a larger factor than a long one (recorded on the CPU demo
#: with both cores taken by other processes: draft 1.34x, verify 1.60x, bookkeeping 2.09x).
EVERY_PHASE_MIN_RATIO = 1.15
MACHINE_SPREAD = 2.5
#: The recording thread waited for a CPU at least this fraction of the time the phases gained
#: (per cycle, more than over the lifetime): other work on the host is where that time went.
HOST_WAIT_EXPLAINS = 0.5
#: Slowed phases whose added times are within this factor of each other: one cost per boundary,
#: when one added time fits the phase means better than one factor.
BOUNDARY_SPREAD = 1.5
#: Slowed phases reported on their own: those slowed by at least this fraction of the largest
#: factor (the others' slowdown is secondary).
DOMINANT_FRACTION = 0.5
#: The advisor considers k from 1 to this, and names another k only for a predicted gain of at
#: least ADVICE_MIN_GAIN.
ADVICE_MAX_K = 8
ADVICE_MIN_GAIN = 0.03
#: Per-sequence tokens/s below this fraction of the past: throughput down.
THROUGHPUT_DROP = 0.8


@dataclass(frozen=True)
class Finding:
    """One conclusion: a stable ``code``, a ``severity`` (:data:`SEVERITIES`), one ``sentence`` a
    person understands, the ``evidence`` numbers it rests on and what to look at or change."""

    code: str
    severity: str
    sentence: str
    evidence: dict[str, float | str | None] = field(default_factory=dict)
    advice: str = ""


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


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1.0 else f"{seconds:.2f} s"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


# -- acceptance profile ---------------------------------------------------------------------------


def conditional_acceptance(b: Breakdown) -> list[tuple[int, float]]:
    """``(position, a_i)`` for each draft position with drafted tokens: a_0 is the first
    position's acceptance, a_i (i >= 1) the acceptance at i given i - 1 accepted, the ratio of
    the unconditional per-position rates (drafted / accepted by position, so sequences that
    drafted fewer tokens count only where they drafted). Stops at the first position nothing
    reached."""
    out: list[tuple[int, float]] = []
    previous: float | None = None
    for label, rate in b.position_acceptance:
        try:
            position = int(label)
        except ValueError:
            continue
        if rate is None:
            break
        if previous is None:
            out.append((position, rate))
        else:
            a = ratio(rate, previous)
            if a is None:
                break
            out.append((position, min(a, 1.0)))
        previous = rate
    return out


def acceptance_profile(b: Breakdown, drafted_first: float | None) -> Finding:
    """Classify the per-position conditional acceptance: a healthy decay, a chain that ends
    early, a collapse from the first position, a flat low profile."""
    cond = conditional_acceptance(b)
    evidence: dict[str, float | str | None] = {
        "acceptance_rate": b.acceptance_rate,
        "drafted_first_position": drafted_first,
        **{f"conditional_{p}": a for p, a in cond},
    }
    if not cond or drafted_first is None or drafted_first < MIN_DRAFTED_TOKENS:
        return Finding(
            "SPEC-ACCEPT-UNKNOWN", "info",
            f"too few drafted tokens to judge acceptance ({_n(drafted_first)} at the first "
            f"position, {MIN_DRAFTED_TOKENS:.0f} needed)",
            evidence, "wait for more traffic or lengthen the window (--wait)",
        )
    profile = ", ".join(f"{p}:{_pct(a)}" for p, a in cond)
    first = cond[0][1]
    later = [a for _, a in cond[1:]]
    if first < FIRST_POSITION_MIN:
        if not later:
            return Finding(
                "SPEC-ACCEPT-LOW", "warn",
                f"only {_pct(first)} of drafted tokens are accepted (k=1, so there is no "
                "per-position profile to tell a broken draft from a weak one)",
                evidence,
                "compare with the draft's offline acceptance; check the draft checkpoint, "
                "its hidden-layer wiring and the tokenizer",
            )
        recovered = median(later)
        if recovered >= first + COLLAPSE_RECOVERY:
            return Finding(
                "SPEC-ACCEPT-COLLAPSE", "fail",
                f"the draft disagrees with the target from its first token: {_pct(first)} of "
                f"first drafted tokens are accepted, but {_pct(recovered)} of those that pass it "
                f"are accepted at the next positions (conditional acceptance {profile})",
                evidence,
                "the draft is wired or loaded wrong rather than weak: check which target "
                "hidden layers an EAGLE head reads, that the draft checkpoint matches this "
                "target (and its revision), the tokenizer and vocabulary of both, and that "
                "draft and target sample with the same temperature and top-p",
            )
        return Finding(
            "SPEC-ACCEPT-FLAT-LOW", "warn",
            f"acceptance is low at every position ({profile}): the draft is weak for this "
            "traffic rather than broken",
            evidence,
            "a draft under-trained or trained on other data, or sampling hotter than it was "
            "trained for; a shorter k wastes less; retrain or distil on this traffic",
        )
    short = next(((p, a) for p, a in cond[1:] if a < CHAIN_MIN), None)
    if short is not None:
        position, a = short
        return Finding(
            "SPEC-ACCEPT-CHAIN-SHORT", "info",
            f"the draft holds the target for {position} positions, then loses it: conditional "
            f"acceptance {_pct(a)} at position {position} ({profile})",
            {**evidence, "chain_end_position": float(position)},
            f"tokens drafted at position {position} and beyond are mostly wasted draft and "
            f"verify work: try k={position}",
        )
    return Finding(
        "SPEC-ACCEPT-HEALTHY", "ok",
        f"acceptance decays as a healthy draft's does: conditional acceptance {profile}",
        evidence,
    )


def _n(value: float | None) -> str:
    return "0" if value is None else f"{value:.0f}"


# -- where the cycle goes -------------------------------------------------------------------------


def _clock(b: Breakdown) -> str | None:
    """The clock whose phase shares tell where the cycle goes: the GPU's when it timed enough
    cycles (host timestamps under CUDA graphs book the GPU's time into whichever phase
    synchronizes), else the host's."""
    for clock in ("gpu", "host"):
        if b.cycle_counts.get(clock, 0.0) >= MIN_CLOCK_CYCLES:
            return clock
    return None


def cycle_bound(b: Breakdown) -> Finding:
    """Verify-, draft- or bookkeeping-bound from the phase shares (GPU clock first)."""
    clock = _clock(b)
    if clock is None:
        return Finding("SPEC-CYCLE-UNKNOWN", "info",
                       f"fewer than {MIN_CLOCK_CYCLES:.0f} cycles on either clock: no phase "
                       "shares to read", {"cycles": b.cycles})
    shares = {p: b.stats[(p, clock)].share for p in b.phases if (p, clock) in b.stats}
    means = {p: b.stats[(p, clock)].mean_seconds for p in b.phases if (p, clock) in b.stats}
    evidence: dict[str, float | str | None] = {"clock": clock}
    for p in shares:
        evidence[f"{p}_share"] = shares[p]
        evidence[f"{p}_mean_seconds"] = means[p]
    text = ", ".join(f"{p} {_pct(s)}" for p, s in shares.items())
    # Under clock=auto with no CUDA initialised the process is CPU-only: the host clock is the
    # device's own, and the caveat would mislead.
    caveat = "" if clock == "gpu" or b.info.get("gpu_clock") == "auto" else (
        " (host clock: with CUDA graphs or asynchronous launches the host books the GPU's time "
        "into the phase that waits for it)"
    )
    known = {p: s for p, s in shares.items() if s is not None}
    if not known:
        return Finding("SPEC-CYCLE-UNKNOWN", "info", "no phase times in the interval", evidence)
    top = max(known, key=lambda p: known[p])
    bk = known.get("bookkeeping")
    if bk is not None and bk >= BOOKKEEPING_MAX_SHARE:
        return Finding(
            "SPEC-CYCLE-BOOKKEEPING-BOUND", "warn",
            f"bookkeeping takes {_pct(bk)} of the cycle on the {clock} clock ({text}){caveat}",
            evidence,
            "bookkeeping (acceptance, KV rollback, handing tokens over) should be a few "
            "percent: look for host syncs (.item(), .cpu(), .tolist()), sampling on the CPU and "
            "per-sequence Python loops in it",
        )
    if known[top] >= BOUND_SHARE and top in ("verify", "draft"):
        if top == "verify":
            return Finding(
                "SPEC-CYCLE-VERIFY-BOUND", "info",
                f"the cycle is verify-bound: verify takes {_pct(known[top])} of it on the "
                f"{clock} clock ({text}){caveat}",
                evidence,
                "expected for a small draft; verify grows with batch size and k, so "
                "speculation pays less at large batches: see the speedup finding",
            )
        return Finding(
            "SPEC-CYCLE-DRAFT-BOUND", "info",
            f"the cycle is draft-bound: the draft takes {_pct(known[top])} of it on the "
            f"{clock} clock ({text}){caveat}",
            evidence,
            "a draft costing more than verify must be accepted very often to pay: a cheaper "
            "draft (fewer layers, CUDA graphs) or a shorter k",
        )
    return Finding(
        "SPEC-CYCLE-BALANCED", "ok",
        f"no phase dominates the cycle on the {clock} clock ({text}){caveat}", evidence,
    )


def host_bound(b: Breakdown) -> Finding:
    """Host-bound when the host cycle exceeds the GPU phases by a measured gap; in lockstep when
    every phase lasts as long on the host as on the GPU (the host waits at each boundary)."""
    gpu_n = b.cycle_counts.get("gpu", 0.0)
    host = b.cycle_mean_seconds.get("host")
    gpu = b.cycle_mean_seconds.get("gpu")
    evidence: dict[str, float | str | None] = {
        "host_cycle_seconds": host, "gpu_cycle_seconds": gpu, "gpu_cycles": gpu_n,
    }
    if gpu_n < MIN_CLOCK_CYCLES or host is None or gpu is None or not host > 0:
        return Finding(
            "SPEC-HOST-UNSEEN", "info",
            "no GPU clock in the interval, so whether the GPU waits for the host cannot be "
            "measured (a CPU-only process, clock=host, or CUDA not initialised)",
            evidence,
        )
    gap = (host - gpu) / host
    evidence["gap_fraction"] = gap
    if gap >= HOST_GAP_MIN:
        return Finding(
            "SPEC-HOST-BOUND", "warn",
            f"the cycle is host-bound: {_ms(host)} on the host against {_ms(gpu)} of GPU "
            f"phases, so the GPU waits {_ms(host - gpu)} ({_pct(gap)}) of every cycle for the "
            "host",
            evidence,
            "look for synchronize calls between phases (profiling code, .item(), .cpu()), "
            "Python overhead and CPU-side sampling; CUDA graphs remove launch cost",
        )
    diffs = []
    for p in b.phases:
        hs, gs = b.stats.get((p, "host")), b.stats.get((p, "gpu"))
        if hs is None or gs is None or hs.mean_seconds is None or gs.mean_seconds is None:
            continue
        diffs.append(abs(hs.mean_seconds - gs.mean_seconds))
    if diffs:
        apart = math.fsum(diffs) / host
        evidence["phase_disagreement_fraction"] = apart
        if apart <= LOCKSTEP_MAX:
            return Finding(
                "SPEC-HOST-LOCKSTEP", "warn",
                f"the host and the GPU meet at every phase boundary (each phase lasts as long "
                f"on both clocks, within {_pct(apart)} of the cycle): nothing overlaps, the "
                "host waits for the GPU between phases or launches eagerly",
                evidence,
                "remove synchronize calls between phases (synchronize-based profiling, "
                ".item(), .cpu() before the cycle ends); capture draft and verify as CUDA graphs",
            )
    return Finding(
        "SPEC-HOST-OVERLAPPED", "ok",
        f"the host runs ahead of the GPU: {_ms(host)} host cycle, {_ms(gpu)} of GPU phases",
        evidence,
    )


# -- stall ----------------------------------------------------------------------------------------


def stall(w: Window) -> Finding | None:
    """``SPEC-STALL`` (fail) when requests are running or waiting and no cycle completed, as the
    generated ``SpecobsDecodingStalled`` alert says; ``None`` when cycles ran."""
    b = w.breakdown
    if b.cycles > 0:
        return None
    evidence: dict[str, float | str | None] = {
        "seconds": b.elapsed_seconds, "requests_running": w.requests_running,
        "requests_waiting": w.requests_waiting, "last_cycle_age_seconds": w.last_cycle_age_seconds,
    }
    ago = (f"; the last cycle ended {w.last_cycle_age_seconds:.0f} s ago"
           if w.last_cycle_age_seconds is not None else "; no cycle yet")
    busy = (w.requests_running or 0.0) + (w.requests_waiting or 0.0)
    if busy > 0:
        return Finding(
            "SPEC-STALL", "fail",
            f"decoding is stalled: {_n(w.requests_running)} requests running and "
            f"{_n(w.requests_waiting)} waiting, and no cycle in {b.elapsed_seconds:.1f} s{ago}",
            evidence,
            "the engine's step loop is hung or blocked: take a stack dump of the worker "
            "(py-spy dump), check for a deadlock, an NCCL hang or a GPU fault (dmesg, "
            "nvidia-smi)",
        )
    if w.requests_running is None and w.requests_waiting is None:
        return Finding(
            "SPEC-NO-CYCLES", "info",
            f"no cycle in {b.elapsed_seconds:.1f} s{ago}; the endpoint exports no request "
            "gauges, so idle cannot be told from stalled",
            evidence,
            "feed Observer.set_requests(running, waiting) (the engine integrations do) so "
            "that a stall is a failure here and in the alert",
        )
    return Finding("SPEC-IDLE", "info",
                   f"idle: no requests and no cycle in {b.elapsed_seconds:.1f} s{ago}", evidence)


# -- speedup explained ----------------------------------------------------------------------------


def speedup(recent: Breakdown, past: Breakdown | None = None) -> Finding:
    """Realized against predicted against the baseline, and below 1 the reason from the data."""
    realized, predicted = speedups(recent)
    clock = "gpu" if predicted.get("gpu") is not None else "host"
    pred = predicted.get(clock)
    base = recent.baseline_tokens_per_second
    evidence: dict[str, float | str | None] = {
        "realized": realized, "predicted": pred, "predicted_clock": clock,
        "sequence_tokens_per_second": recent.sequence_tokens_per_second,
        "baseline_tokens_per_second": base, "mean_batch_size": recent.mean_batch_size,
        "cycles": recent.cycles,
    }
    if base is None or realized is None:
        return Finding(
            "SPEC-SPEEDUP-UNKNOWN", "info",
            "no non-speculative baseline to compare with"
            + (f"; from acceptance and phase costs the predicted speedup is {_x(pred)}"
               if pred is not None else ""),
            evidence,
            "configure(baseline_tokens_per_second=...) or SPECOBS_BASELINE_TOKENS_PER_SECOND, "
            "measured at the batch size the server runs",
        )
    if recent.cycles < MIN_SPEEDUP_CYCLES:
        return Finding(
            "SPEC-SPEEDUP-UNKNOWN", "info",
            f"realized speedup {_x(realized)} over only {recent.cycles:.0f} cycles: too short a "
            f"window to judge ({MIN_SPEEDUP_CYCLES:.0f} needed)",
            evidence, "lengthen the window (--wait)",
        )
    head = (f"{_x(realized)} the baseline's tokens/s per sequence "
            f"({recent.sequence_tokens_per_second or 0:.1f} against {base:.1f} at mean batch "
            f"{recent.mean_batch_size or 0:.1f}; predicted {_x(pred)} from acceptance and "
            f"{clock} phase costs)")
    if realized >= 1.0:
        return Finding("SPEC-SPEEDUP-OK", "ok", f"speculation is faster: {head}", evidence)
    if past is not None and past.acceptance_rate is not None \
            and recent.acceptance_rate is not None \
            and recent.acceptance_rate >= past.acceptance_rate + WARMING_RISE_MIN:
        return Finding(
            "SPEC-SPEEDUP-WARMING", "warn",
            f"speculation is slower, but acceptance is still rising ({_pct(past.acceptance_rate)}"
            f" over the lifetime, {_pct(recent.acceptance_rate)} now): {head}",
            evidence, "the draft is warming up (training, a cache filling): run again later",
        )
    # Per sequence, a plain decode step yields one token in 1/baseline seconds; a cycle yields
    # E tokens in t_cycle. Which part of t_cycle costs more than the E steps it replaces?
    host_cycle = recent.cycle_mean_seconds.get("host")
    tokens = (recent.sequence_tokens_per_second * host_cycle
              if recent.sequence_tokens_per_second is not None and host_cycle is not None
              else None)
    step = 1.0 / base
    evidence["tokens_per_sequence_cycle"] = tokens
    evidence["baseline_step_seconds"] = step
    verify = recent.stats.get(("verify", clock))
    draft = recent.stats.get(("draft", clock))
    v = verify.mean_seconds if verify is not None else None
    d = draft.mean_seconds if draft is not None else None
    reason: str
    if tokens is not None and d is not None and v is not None and pred is not None and pred < 1.0:
        needed = (d + v) / v
        reason = (f"acceptance is too low for the draft's cost: a cycle yields {tokens:.2f} "
                  f"tokens per sequence, and a draft costing {d / v:.2f} of verify needs more "
                  f"than {needed:.2f}")
        advice = "see the acceptance finding: fix the draft, or turn speculation off"
    elif v is not None and tokens is not None and v > tokens * step:
        reason = (f"verify-bound at batch {recent.mean_batch_size or 0:.1f}: one verify costs "
                  f"{_ms(v)}, more than the {tokens:.2f} plain decode steps "
                  f"({_ms(tokens * step)}) its tokens replace")
        advice = ("speculation stops paying at this batch size: disable it above it (vLLM: "
                  "disable by batch size), or lower k")
    else:
        reason = ("the time outside draft and verify (bookkeeping, host overhead) eats the "
                  f"gain: the {clock} clock predicts {_x(pred)}")
        advice = "see the bookkeeping and host findings"
    return Finding("SPEC-SPEEDUP-LOSS", "fail",
                   f"speculation is slower than the baseline: {head}; {reason}", evidence,
                   advice)


# -- the recent window against its own past -------------------------------------------------------


def _mean(b: Breakdown, phase: str, clock: str) -> float | None:
    s = b.stats.get((phase, clock))
    return None if s is None else s.mean_seconds


@dataclass(frozen=True)
class Reference:
    """What the recent window is compared with: the codes' prefix and the words for it."""

    #: ``SPEC-RECENT`` (the endpoint's lifetime) or ``SPEC-SAVED`` (a run saved earlier).
    prefix: str
    #: How a sentence places the reference's figure: "over the lifetime".
    over: str
    #: The reference as a noun: "the lifetime".
    name: str


#: The lifetime before the window (a bare /metrics endpoint's counters since the start).
LIFETIME = Reference("SPEC-RECENT", "over the lifetime", "the lifetime")


def saved_run(name: str) -> Reference:
    """A run saved earlier (``specobs report --save``), ``name`` saying which."""
    return Reference("SPEC-SAVED", f"in the saved run ({name})", f"the saved run ({name})")


def against_past(recent: Breakdown, past: Breakdown, drafted: tuple[float, float] | None = None,
                 reference: Reference = LIFETIME) -> list[Finding]:
    """The recent window against the lifetime before it, or against another ``reference`` (a
    saved earlier run): acceptance down, a phase slower (or several by the same time, or all by
    the same factor), per-sequence throughput down, each with the size of the change.
    ``drafted``: drafted tokens (past, recent) for the acceptance test's z score. Empty when
    either side has too few cycles."""
    if recent.cycles < MIN_RECENT_CYCLES or past.cycles < MIN_PAST_CYCLES:
        return []
    ref = reference
    out: list[Finding] = []
    pa, ra = past.acceptance_rate, recent.acceptance_rate
    found, z = _acceptance_below(pa, ra, drafted)
    if found and pa is not None and ra is not None:
        out.append(Finding(
            f"{ref.prefix}-ACCEPT-DOWN", "warn",
            f"acceptance fell from {_pct(pa)} {ref.over} to {_pct(ra)} in the last "
            f"{recent.elapsed_seconds:.1f} s ({(ra - pa) * 100:+.0f} points)",
            {"past": pa, "recent": ra, "z": z},
            "something changed in the draft or the traffic: a deploy, a new draft "
            "checkpoint, a different prompt mix; see the acceptance profile",
        ))
    clock = "gpu" if recent.cycle_counts.get("gpu", 0.0) >= MIN_CLOCK_CYCLES and \
        past.cycle_counts.get("gpu", 0.0) >= MIN_CLOCK_CYCLES else "host"
    past_cycle = past.cycle_mean_seconds.get(clock)
    changes: dict[str, tuple[float, float]] = {}
    for p in recent.phases:
        a, b = _mean(past, p, clock), _mean(recent, p, clock)
        if a is not None and b is not None and a > 0:
            changes[p] = (a, b)
    if changes and past_cycle:
        out.extend(_phase_changes(changes, past_cycle, clock, past, recent, ref))
    pt, rt = past.sequence_tokens_per_second, recent.sequence_tokens_per_second
    if pt is not None and rt is not None and rt < pt * THROUGHPUT_DROP:
        explained = [f for f in out
                     if f.code.removeprefix(ref.prefix + "-") not in NOT_THE_SPECULATION]
        out.append(Finding(
            f"{ref.prefix}-THROUGHPUT-DOWN", "warn" if explained or not out else "info",
            f"per-sequence tokens/s fell from {pt:.1f} {ref.over} to {rt:.1f} in the last "
            f"{recent.elapsed_seconds:.1f} s ({(rt / pt - 1) * 100:+.0f}%)",
            {"past": pt, "recent": rt},
            "the other recent findings say why" if out else
            "neither acceptance nor a phase explains it: the batch or the prompt mix changed",
        ))
    if not out:
        out.append(Finding(f"{ref.prefix}-STEADY", "ok",
                           f"the last {recent.elapsed_seconds:.1f} s match {ref.name} "
                           f"(acceptance {_pct(pa)} → {_pct(ra)})", {"past": pa, "recent": ra}))
    return out


#: Recent findings (codes without their prefix) that explain a slowdown by the machine, not by
#: the speculation.
NOT_THE_SPECULATION = frozenset({"SLOWER-ALL", "HOST-BUSY"})


def _acceptance_below(reference: float | None, rate: float | None,
                      drafted: tuple[float, float] | None) -> tuple[bool, float | None]:
    """Whether ``rate`` is below ``reference`` by a drop worth a finding (at least
    ACCEPT_DROP_MIN, and a z score of ACCEPT_DROP_Z where the drafted counts give one), and
    that z score (None without counts)."""
    if reference is None or rate is None or reference - rate < ACCEPT_DROP_MIN:
        return False, None
    z = _z(reference, rate, drafted)
    return z is None or z >= ACCEPT_DROP_Z, z


def _z(pa: float, ra: float, drafted: tuple[float, float] | None) -> float | None:
    if drafted is None:
        return None
    n1, n2 = drafted
    if not (n1 > 0 and n2 > 0):
        return None
    pooled = (pa * n1 + ra * n2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    return math.inf if se == 0 else (pa - ra) / se


def _phase_changes(changes: dict[str, tuple[float, float]], past_cycle: float, clock: str,
                   past: Breakdown, recent: Breakdown, ref: Reference) -> list[Finding]:
    ratios = {p: b / a for p, (a, b) in changes.items()}
    added = {p: b - a for p, (a, b) in changes.items()}
    slowed = [p for p in changes if ratios[p] >= SLOWER_RATIO
              and added[p] >= SLOWER_CYCLE_FRACTION * past_cycle]
    if not slowed:
        return []
    evidence: dict[str, float | str | None] = {"clock": clock,
                                              "past_batch": past.mean_batch_size,
                                              "recent_batch": recent.mean_batch_size}
    for p, (a, b) in changes.items():
        evidence[f"{p}_past_seconds"] = a
        evidence[f"{p}_recent_seconds"] = b
    each = ", ".join(f"{p} {_ms(changes[p][0])} → {_ms(changes[p][1])}" for p in changes)
    busy = _host_busy(changes, clock, past, recent, each, evidence, ref)
    if busy is not None:
        return [busy]
    # Two explanations, fitted by least squares to the phase means: the whole machine slowed
    # (every phase times one factor r) or a fixed cost was added at the boundaries of the slowed
    # phases (each slowed phase plus one time c, the others unchanged). The machine, when every
    # phase of any size slowed by a like factor and that fits at least twice as well, or every
    # such phase slowed by a wider spread of factors and one factor still fits at least as well
    # (preemption by other work on the host); a cost per boundary, when the slowed phases gained
    # like times and one added time fits better than one factor; otherwise each slowed phase is
    # reported on its own.
    r = math.fsum(a * b for a, b in changes.values()) / math.fsum(a * a for a, _ in
                                                                   changes.values())
    sse_uniform = math.fsum((b - r * a) ** 2 for a, b in changes.values())
    unchanged = math.fsum(added[p] ** 2 for p in changes if p not in slowed)
    c = math.fsum(added[p] for p in slowed) / len(slowed)
    sse_boundary = unchanged + math.fsum((added[p] - c) ** 2 for p in slowed)
    evidence["uniform_factor"] = r
    evidence["uniform_squared_error"] = sse_uniform
    evidence["boundary_seconds"] = c
    evidence["boundary_squared_error"] = sse_boundary
    large = [ratios[p] for p, (a, _) in changes.items() if a >= UNIFORM_MIN_SHARE * past_cycle]
    alike = bool(large) and max(large) <= UNIFORM_SPREAD * min(large)
    everywhere = bool(large) and min(large) >= EVERY_PHASE_MIN_RATIO and \
        max(large) <= MACHINE_SPREAD * min(large)
    if r >= SLOWER_RATIO and ((alike and 2 * sse_uniform <= sse_boundary)
                              or (everywhere and sse_uniform <= sse_boundary)):
        return [Finding(
            f"{ref.prefix}-SLOWER-ALL", "info",
            f"every phase is {r:.1f}x slower than {ref.over} ({each}, {clock} "
            "clock): the machine is busier, its clock throttles, or the batch grew (mean "
            f"batch {past.mean_batch_size or 0:.1f} → {recent.mean_batch_size or 0:.1f})",
            evidence,
            "not the speculation itself: check the host's load and the batch size",
        )]
    amounts = [added[p] for p in slowed]
    even = max(amounts) <= BOUNDARY_SPREAD * min(amounts)
    if len(slowed) >= 2 and even and sse_boundary < sse_uniform:
        names = " and ".join(slowed)
        return [Finding(
            f"{ref.prefix}-BOUNDARY-COST", "warn",
            f"{names} are each about {_ms(c)} slower per cycle than {ref.over} "
            f"({each}, {clock} clock): the same time added at each phase "
            "boundary, a cost paid between phases rather than work in any one of them",
            evidence,
            "look for a synchronize between phases (synchronize-based profiling, "
            ".item(), .cpu()), a profiler or logging at the phase boundaries",
        )]
    top = max(ratios[p] for p in slowed)
    shown = [p for p in slowed if ratios[p] >= DOMINANT_FRACTION * top]
    others = [ratios[p] for p in ratios if p not in shown]
    reference = median(others) if others else 1.0
    out = []
    for p in sorted(shown, key=lambda p: -ratios[p]):
        a, b = changes[p]
        out.append(Finding(
            f"{ref.prefix}-PHASE-SLOWER", "warn",
            f"{p} is {ratios[p]:.1f}x slower than {ref.over} ({_ms(a)} → {_ms(b)} per "
            f"cycle, {clock} clock) while the other phases changed {reference:.2f}x",
            {**evidence, "phase": p, "ratio": ratios[p]},
            {"verify": "the target's forward got dearer: a larger batch or context, a "
                       "slower kernel, repeated work, or contention on the device",
             "draft": "the draft got dearer: a longer k, a larger draft, or its CUDA graphs "
                      "no longer replaying",
             }.get(p, "look at what this phase does and what changed in it"),
        ))
    return out


def _host_busy(changes: dict[str, tuple[float, float]], clock: str, past: Breakdown,
               recent: Breakdown, each: str, evidence: dict[str, float | str | None],
               ref: Reference) -> Finding | None:
    """The phases' added time is what the recording thread spent runnable but off a CPU (Linux
    schedstat, ``specobs_worker_thread_time{state="waiting"}``): a host busy with other work, not
    a phase or a boundary of the speculation. ``None`` without that counter or when the wait
    explains less than :data:`HOST_WAIT_EXPLAINS` of the added time."""
    pw, rw = past.worker_waiting_seconds_per_cycle, recent.worker_waiting_seconds_per_cycle
    added = math.fsum(max(0.0, b - a) for a, b in changes.values())
    if pw is None or rw is None or added <= 0 or rw - pw < HOST_WAIT_EXPLAINS * added:
        return None
    share = min(1.0, (rw - pw) / added)
    return Finding(
        f"{ref.prefix}-HOST-BUSY", "info",
        f"the engine's thread waited {_ms(rw)} per cycle for a CPU in the last "
        f"{recent.elapsed_seconds:.1f} s against {_ms(pw)} {ref.over}: other work on "
        f"the host took the CPUs, {_pct(share)} of the {_ms(added)} per cycle the phases "
        f"gained ({each}, {clock} clock)",
        {**evidence, "past_wait_seconds": pw, "recent_wait_seconds": rw,
         "added_seconds": added},
        "not the speculation: look at what else runs on the host and at the pod's CPU limit; "
        "give the engine's thread a core of its own",
    )


# -- against the cohort ---------------------------------------------------------------------------

#: A phase this many times the cohort's mean, at a batch no larger than BATCH_TOLERANCE times
#: theirs: the generated PhaseLatencyAboveCohort alert's default ratios (MixinConfig).
COHORT_PHASE_RATIO = 1.5
COHORT_BATCH_TOLERANCE = 1.2


def against_cohort(b: Breakdown, cohort: Breakdown, peers: int, name: str,
                   drafted: tuple[float, float] | None = None) -> list[Finding]:
    """One server's window against the same window of the other servers of its cohort (the
    same model and engine, and cluster and namespace where the labels say), summed: ``peers``
    of them, ``name`` saying which in the sentences. ``drafted``: first-position drafted tokens
    (server, cohort) for the acceptance test's z score. Empty when either side has too few
    cycles."""
    if b.cycles < MIN_RECENT_CYCLES or cohort.cycles < MIN_RECENT_CYCLES or peers < 1:
        return []
    out: list[Finding] = []
    others = f"the other {peers} server{'s' if peers != 1 else ''} of {name}"
    ca, ra = cohort.acceptance_rate, b.acceptance_rate
    found, z = _acceptance_below(ca, ra, drafted)
    if found and ca is not None and ra is not None:
        out.append(Finding(
            "SPEC-COHORT-ACCEPT-BELOW", "warn",
            f"acceptance is {_pct(ra)} here against {_pct(ca)} on {others} "
            f"({(ra - ca) * 100:+.0f} points, same window)",
            {"server": ra, "cohort": ca, "peers": float(peers), "z": z},
            "the same model drafts worse on this server alone: a different draft "
            "checkpoint or config was deployed here, or it serves other traffic; see "
            "the acceptance profile",
        ))
    clock = "gpu" if b.cycle_counts.get("gpu", 0.0) >= MIN_CLOCK_CYCLES and \
        cohort.cycle_counts.get("gpu", 0.0) >= MIN_CLOCK_CYCLES else "host"
    mine, theirs = b.mean_batch_size, cohort.mean_batch_size
    bigger_batch = mine is not None and theirs is not None and \
        mine > COHORT_BATCH_TOLERANCE * theirs
    slower = []
    for p in b.phases:
        x, y = _mean(b, p, clock), _mean(cohort, p, clock)
        if x is not None and y is not None and y > 0 and x >= COHORT_PHASE_RATIO * y:
            slower.append((x / y, p, x, y))
    if slower and not bigger_batch:
        slower.sort(reverse=True)
        ratio, phase, x, y = slower[0]
        also = ", ".join(f"{p} {r:.1f}x" for r, p, _, _ in slower[1:])
        out.append(Finding(
            "SPEC-COHORT-PHASE-SLOWER", "warn",
            f"{phase} takes {_ms(x)} per cycle here against {_ms(y)} on {others} "
            f"({ratio:.1f}x, {clock} clock, mean batch {mine or 0:.1f} against "
            f"{theirs or 0:.1f})" + (f"; also {also}" if also else ""),
            {"phase": phase, "ratio": ratio, "server_seconds": x, "cohort_seconds": y,
             "clock": clock, "server_batch": mine, "cohort_batch": theirs,
             "peers": float(peers)},
            "this server is slower at the same work: its GPU (clocks, thermals, a noisy "
            "neighbour), its driver or kernels, or its config (TP, graphs, quantization) "
            "differ from its peers'",
        ))
    if not out:
        out.append(Finding(
            "SPEC-COHORT-MATCHES", "ok",
            f"acceptance {_pct(ra)} against {_pct(ca)} and no phase "
            f"{COHORT_PHASE_RATIO:g}x slower than on {others}",
            {"server": ra, "cohort": ca, "peers": float(peers)},
        ))
    return out


# -- the advisor ----------------------------------------------------------------------------------


def expected_tokens(conditional: Sequence[float], k: int) -> float:
    """Tokens one sequence gains per cycle drafting ``k``: 1 + a_0 + a_0 a_1 + ... +
    a_0 ... a_(k-1), with the conditional rates beyond the measured ones taken as the last one."""
    total, survive = 1.0, 1.0
    for i in range(k):
        a = conditional[min(i, len(conditional) - 1)]
        survive *= a
        total += survive
    return total


def advise_k(b: Breakdown, verify_scaling: float = 0.0) -> Finding | None:
    """The k that maximizes tokens/s per sequence under a stated cost model, from the measured
    conditional acceptance and phase costs (GPU clock first); ``None`` without the data.

    Cost model: a cycle drafting k' costs t_bookkeeping + t_verify * (1 + s * (k' - k) / (k + 1))
    + t_draft * k' / k, where k is the length measured, t_* the measured means and s =
    ``verify_scaling`` the part of verify that grows with the positions verified (0: verify
    costs the same for any k', true where verify is memory- or launch-bound, as on a GPU at small
    batch; 1: proportional to the k' + 1 positions). Tokens per cycle are
    :func:`expected_tokens`, the measured conditional rates held fixed: beyond the measured k
    the last rate is extrapolated, and the first position's rate itself moves with k (where
    cycles start depends on k: docs/diagnosis.md), so a recommendation away from the measured k
    is a direction to try, not a promise."""
    clock = _clock(b)
    cond = [a for _, a in conditional_acceptance(b)]
    k = sum(1 for _, rate in b.position_acceptance if rate is not None)
    if clock is None or not cond or k < 1 or len(cond) < k:
        return None
    means = {p: b.stats[(p, clock)].mean_seconds for p in b.phases if (p, clock) in b.stats}
    d, v = means.get("draft"), means.get("verify")
    if d is None or v is None or not v > 0:
        return None
    rest = math.fsum(m for p, m in means.items() if p not in ("draft", "verify") and m)

    def rate(kk: int) -> float:
        cost = rest + v * (1 + verify_scaling * (kk - k) / (k + 1)) + d * kk / k
        return expected_tokens(cond, kk) / cost

    current = rate(k)
    best = max(range(1, ADVICE_MAX_K + 1), key=rate)
    gain = rate(best) / current - 1
    evidence: dict[str, float | str | None] = {
        "clock": clock, "k": float(k), "best_k": float(best), "predicted_gain": gain,
        "verify_scaling": verify_scaling,
        **{f"predicted_tokens_per_second_k{kk}": rate(kk) for kk in range(1, ADVICE_MAX_K + 1)},
    }
    if best == k or gain < ADVICE_MIN_GAIN:
        return Finding("SPEC-ADVICE-K", "ok",
                       f"k={k} is the best speculation length the measured acceptance and "
                       f"{clock} costs predict (another k gains under "
                       f"{ADVICE_MIN_GAIN * 100:.0f}%)", evidence)
    beyond = " (extrapolated beyond the measured k)" if best > k else ""
    return Finding(
        "SPEC-ADVICE-K", "info",
        f"k={best} is predicted {gain * 100:+.0f}% tokens/s per sequence against the k={k} "
        f"measured{beyond}, from the conditional acceptance and the {clock} phase costs",
        evidence,
        f"try k={best} and compare; the model holds acceptance fixed per position and verify's "
        "cost fixed in k",
    )


# -- the forward's cost in tokens, and the batch size where speculation stops paying -------------

#: Batch sizes the threshold search looks at, as multiples of the measured mean batch.
BATCH_SEARCH_MAX_FACTOR = 64.0


@dataclass(frozen=True)
class ForwardCost:
    """A target forward over n tokens costs ``fixed_seconds + per_token_seconds * n``: fitted
    through the plain decode step (the measured baseline: n = B, one token per sequence) and the
    verify phase (n = B (k + 1)) at the window's mean batch B."""

    fixed_seconds: float
    per_token_seconds: float
    batch: float
    k: int


def forward_cost(b: Breakdown, plain_step_seconds: float | None) -> ForwardCost | None:
    """The :class:`ForwardCost` of ``b``'s target from ``plain_step_seconds`` (1 / a baseline
    measured on the served batch) and the measured verify mean (GPU clock first); ``None``
    without either. A verify no dearer than the plain step gives ``per_token_seconds`` 0: the
    forward is bound by reading weights or launching kernels, not by the tokens it computes."""
    clock = _clock(b)
    k = sum(1 for _, rate in b.position_acceptance if rate is not None)
    batch = b.mean_batch_size
    if clock is None or k < 1 or batch is None or not batch > 0 or plain_step_seconds is None \
            or not plain_step_seconds > 0:
        return None
    v = _mean(b, "verify", clock)
    if v is None or not v > 0:
        return None
    per_token = max(0.0, (v - plain_step_seconds) / (batch * k))
    return ForwardCost(v - per_token * batch * (k + 1), per_token, batch, k)


def verify_scaling(cost: ForwardCost | None) -> float:
    """The part of verify that grows with the positions verified (:func:`advise_k`'s ``s``):
    0 without a :class:`ForwardCost`."""
    if cost is None:
        return 0.0
    v = cost.fixed_seconds + cost.per_token_seconds * cost.batch * (cost.k + 1)
    return min(1.0, max(0.0, cost.per_token_seconds * cost.batch * (cost.k + 1) / v))


def batch_threshold(b: Breakdown, plain_step_seconds: float | None) -> Finding | None:
    """The batch size above which speculation stops paying (what vLLM users set as
    ``disable_by_batch_size``), from the window's :class:`ForwardCost`; ``None`` without one.

    Model: at batch B' a plain step costs f + p B' and verify f + p B' (k + 1), the draft and
    bookkeeping scale with verify's cost (the draft is a smaller forward over as many sequences),
    and the tokens per sequence-cycle stay the measured ones. Speculation pays at B' while
    E / (cycle at B') exceeds 1 / (plain step at B'). The forward's costs are fitted at the one
    mean batch measured, so a threshold away from it is extrapolated along a straight line (a
    GPU's cost per token drops as it saturates): a direction and an order of magnitude."""
    cost = forward_cost(b, plain_step_seconds)
    clock = _clock(b)
    host_cycle = b.cycle_mean_seconds.get("host")
    if cost is None or clock is None or host_cycle is None or b.sequence_tokens_per_second is None:
        return None
    assert plain_step_seconds is not None
    tokens = b.sequence_tokens_per_second * host_cycle
    means = {p: b.stats[(p, clock)].mean_seconds for p in b.phases if (p, clock) in b.stats}
    v = means.get("verify") or 0.0
    others = math.fsum(m for p, m in means.items() if p != "verify" and m)
    # Time of the host cycle outside the phases on this clock (host overhead) stays fixed.
    outside = max(0.0, host_cycle - v - others) if clock == "host" else 0.0

    def gain(batch: float) -> float:
        verify = cost.fixed_seconds + cost.per_token_seconds * batch * (cost.k + 1)
        cycle = verify * (1 + others / v) + outside if v > 0 else verify + outside
        plain = cost.fixed_seconds + cost.per_token_seconds * batch
        return tokens * plain / cycle

    now = gain(cost.batch)
    evidence: dict[str, float | str | None] = {
        "clock": clock, "k": float(cost.k), "mean_batch": cost.batch,
        "plain_step_seconds": plain_step_seconds, "fixed_seconds": cost.fixed_seconds,
        "per_token_seconds": cost.per_token_seconds, "tokens_per_sequence_cycle": tokens,
        "modelled_speedup": now,
    }
    top = cost.batch * BATCH_SEARCH_MAX_FACTOR
    if gain(1.0) < 1.0:
        return Finding(
            "SPEC-ADVICE-BATCH", "info",
            f"speculation does not pay at any batch size by the cost model: {tokens:.2f} tokens "
            f"per sequence-cycle do not cover a cycle of {_ms(host_cycle)} against a plain step "
            f"of {_ms(plain_step_seconds)} at mean batch {cost.batch:.1f}",
            {**evidence, "threshold_batch": 1.0}, "see the speedup and acceptance findings",
        )
    if cost.per_token_seconds <= 0 or gain(top) >= 1.0:
        return Finding(
            "SPEC-ADVICE-BATCH", "ok",
            f"no batch size up to {top:.0f} where speculation stops paying: verify costs "
            f"{'no more than' if cost.per_token_seconds <= 0 else 'little more than'} a plain "
            f"step at mean batch {cost.batch:.1f} ({_ms(v)} against {_ms(plain_step_seconds)}, "
            f"{clock} clock), so the forward is bound by weights or launches, not tokens",
            {**evidence, "threshold_batch": None},
        )
    lo, hi = 1.0, top  # gain(lo) >= 1 > gain(hi); gain falls with the batch
    while hi - lo > 0.01 * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gain(mid) >= 1.0 else (lo, mid)
    where = ("extrapolated beyond" if lo > cost.batch else "interpolated below")
    return Finding(
        "SPEC-ADVICE-BATCH", "info",
        f"speculation stops paying above batch {lo:.0f} by the cost model ({where} the mean "
        f"batch {cost.batch:.1f} measured: verify {_ms(v)} against a plain step of "
        f"{_ms(plain_step_seconds)}, {cost.per_token_seconds * 1e6:.1f} µs per token, "
        f"{tokens:.2f} tokens per sequence-cycle)",
        {**evidence, "threshold_batch": lo},
        f"disable speculation above batch {lo:.0f} (vLLM: disable_by_batch_size) and check it "
        "by measuring both sides of it",
    )


# -- everything -----------------------------------------------------------------------------------


def diagnose(recent: Window, past: Window | None = None) -> list[Finding]:
    """Every finding for ``recent``, and against ``past`` (the lifetime before it) when given.
    A stall is the only finding when there is one: nothing else was measured."""
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
        threshold = batch_threshold(b, plain)
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
