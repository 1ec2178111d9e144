"""The classifiers of one window: the acceptance profile, where the cycle goes, whether the
host holds the GPU back, a stall, and the speedup with its reason. Each decides a code, a
severity and the evidence; ``_words`` says it."""

from __future__ import annotations

import math
from statistics import median
from typing import Any

from specobs.tools._breakdown import Breakdown, ratio, speedups
from specobs.tools._diagnosis import _thresholds as th
from specobs.tools._diagnosis._compare import slower_by
from specobs.tools._diagnosis._cost import Prediction
from specobs.tools._diagnosis._findings import Evidence, Finding, Window, _clock
from specobs.tools._diagnosis._words import found

__all__ = [
    "acceptance_profile", "between_cycles", "conditional_acceptance", "cycle_bound", "host_bound",
    "speedup", "stall",
]


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
    evidence: Evidence = {
        "acceptance_rate": b.acceptance_rate,
        "drafted_first_position": drafted_first,
        **{f"conditional_{p}": a for p, a in cond},
    }
    if not cond or drafted_first is None or drafted_first < th.MIN_DRAFTED_TOKENS:
        return found("SPEC-ACCEPT-UNKNOWN", "info", evidence)
    first = cond[0][1]
    later = [a for _, a in cond[1:]]
    if first < th.FIRST_POSITION_MIN:
        return _weak_first(evidence, first, later)
    short = next(((p, a) for p, a in cond[1:] if a < th.CHAIN_MIN), None)
    if short is not None:
        position, a = short
        return found("SPEC-ACCEPT-CHAIN-SHORT", "info",
                     {**evidence, "chain_end_position": float(position)},
                     position=position, chain_end=a)
    return found("SPEC-ACCEPT-HEALTHY", "ok", evidence)


def _weak_first(evidence: Evidence, first: float, later: list[float]) -> Finding:
    """A first position below :data:`FIRST_POSITION_MIN`: one position alone, a collapse the
    later positions recover from, or a draft weak at every position."""
    if not later:
        return found("SPEC-ACCEPT-LOW", "warn", evidence, first=first)
    recovered = median(later)
    if recovered >= first + th.COLLAPSE_RECOVERY:
        return found("SPEC-ACCEPT-COLLAPSE", "fail", evidence, first=first, recovered=recovered)
    return found("SPEC-ACCEPT-FLAT-LOW", "warn", evidence)


# -- where the cycle goes -------------------------------------------------------------------------


def cycle_bound(b: Breakdown) -> Finding:
    """Verify-, draft- or bookkeeping-bound from the phase shares (GPU clock first)."""
    clock = _clock(b)
    if clock is None:
        return found("SPEC-CYCLE-UNKNOWN", "info", {"cycles": b.cycles}, "no-clock")
    shares = {p: b.stats[(p, clock)].share for p in b.phases if (p, clock) in b.stats}
    evidence: Evidence = {"clock": clock}
    for p, share in shares.items():
        evidence[f"{p}_share"] = share
        evidence[f"{p}_mean_seconds"] = b.stats[(p, clock)].mean_seconds
    known = {p: s for p, s in shares.items() if s is not None}
    if not known:
        return found("SPEC-CYCLE-UNKNOWN", "info", evidence, "no-times")
    host_books_gpu = clock != "gpu" and b.info.get("gpu_clock") != "auto"
    top = max(known, key=lambda p: known[p])
    bk = known.get("bookkeeping")
    if bk is not None and bk >= th.BOOKKEEPING_MAX_SHARE:
        code, severity = "SPEC-CYCLE-BOOKKEEPING-BOUND", "warn"
    elif known[top] >= th.BOUND_SHARE and top == "verify":
        code, severity = "SPEC-CYCLE-VERIFY-BOUND", "info"
    elif known[top] >= th.BOUND_SHARE and top == "draft":
        code, severity = "SPEC-CYCLE-DRAFT-BOUND", "info"
    else:
        code, severity = "SPEC-CYCLE-BALANCED", "ok"
    return found(code, severity, evidence, host_books_gpu=host_books_gpu)


def host_bound(b: Breakdown) -> Finding:
    """Host-bound when the host cycle exceeds the GPU phases by a measured gap; in lockstep when
    every phase lasts as long on the host as on the GPU (the host waits at each boundary)."""
    gpu_n = b.cycle_counts.get("gpu", 0.0)
    host = b.cycle_mean_seconds.get("host")
    gpu = b.cycle_mean_seconds.get("gpu")
    evidence: Evidence = {
        "host_cycle_seconds": host, "gpu_cycle_seconds": gpu, "gpu_cycles": gpu_n,
    }
    if gpu_n < th.MIN_CLOCK_CYCLES or host is None or gpu is None or not host > 0:
        return found("SPEC-HOST-UNSEEN", "info", evidence)
    gap = (host - gpu) / host
    evidence["gap_fraction"] = gap
    if gap >= th.HOST_GAP_MIN:
        return found("SPEC-HOST-BOUND", "warn", evidence, waits=host - gpu)
    apart = _phase_disagreement(b, host)
    if apart is not None:
        evidence["phase_disagreement_fraction"] = apart
        if apart <= th.LOCKSTEP_MAX:
            return found("SPEC-HOST-LOCKSTEP", "warn", evidence)
    return found("SPEC-HOST-OVERLAPPED", "ok", evidence)


def _phase_disagreement(b: Breakdown, host_cycle: float) -> float | None:
    """How far the host's and the GPU's phase means are apart, summed over the phases, as a
    fraction of the host cycle; ``None`` where no phase has both."""
    diffs = []
    for p in b.phases:
        hs, gs = b.stats.get((p, "host")), b.stats.get((p, "gpu"))
        if hs is None or gs is None or hs.mean_seconds is None or gs.mean_seconds is None:
            continue
        diffs.append(abs(hs.mean_seconds - gs.mean_seconds))
    return math.fsum(diffs) / host_cycle if diffs else None


# -- stall ----------------------------------------------------------------------------------------


def stall(w: Window) -> Finding | None:
    """``SPEC-STALL`` (fail) when requests are running or waiting and no cycle completed, as the
    generated ``SpecobsDecodingStalled`` alert says; ``None`` when cycles ran."""
    b = w.breakdown
    if b.cycles > 0:
        return None
    evidence: Evidence = {
        "seconds": b.elapsed_seconds, "requests_running": w.requests_running,
        "requests_waiting": w.requests_waiting, "last_cycle_age_seconds": w.last_cycle_age_seconds,
    }
    if (w.requests_running or 0.0) + (w.requests_waiting or 0.0) > 0:
        return found("SPEC-STALL", "fail", evidence)
    if w.requests_running is None and w.requests_waiting is None:
        return found("SPEC-NO-CYCLES", "info", evidence)
    return found("SPEC-IDLE", "info", evidence)


# -- speedup explained ----------------------------------------------------------------------------


def _slower_phase(recent: Breakdown, past: Breakdown | None,
                  clock: str) -> tuple[float, str] | None:
    """``(factor, phase)`` when draft or verify got slower on ``clock`` by the phase findings'
    own test (:func:`slower_by`; the larger factor), else ``None``: a loss a slower phase
    explains is not the draft warming up."""
    if past is None:
        return None
    factors = [(f, p) for p in ("draft", "verify")
               if (f := slower_by(past, recent, p, clock)) is not None]
    return max(factors) if factors else None


def speedup(recent: Breakdown, past: Breakdown | None = None,
            prediction: Prediction | None = None) -> Finding:
    """Realized against predicted against the baseline, and below 1 the reason from the data.
    ``prediction``: the cost model's (:func:`specobs.tools._diagnosis.predict`); where the two
    differ by more than the calibration tolerance the sentence says where."""
    realized, by_clock = speedups(recent)
    clock = "gpu" if by_clock.get("gpu") is not None else "host"
    pred = prediction.predicted if prediction is not None else None
    base = recent.baseline_tokens_per_second
    evidence: Evidence = {
        "realized": realized, "predicted": pred,
        "predicted_one_verify_per_plain_step": by_clock.get(clock), "predicted_clock": clock,
        "sequence_tokens_per_second": recent.sequence_tokens_per_second,
        "baseline_tokens_per_second": base, "mean_batch_size": recent.mean_batch_size,
        "cycles": recent.cycles,
        **(prediction.evidence() if prediction is not None else {}),
    }
    if base is None or realized is None:
        return found("SPEC-SPEEDUP-UNKNOWN", "info", evidence, "no-baseline")
    if recent.cycles < th.MIN_SPEEDUP_CYCLES:
        return found("SPEC-SPEEDUP-UNKNOWN", "info", evidence, "short")
    where = prediction.where(realized) if prediction is not None and pred is not None else None
    if where is not None and pred is not None:
        evidence["calibration_off"] = pred / realized - 1
    if realized >= 1.0:
        return found("SPEC-SPEEDUP-OK", "ok", evidence, where=where)
    slower = _slower_phase(recent, past, clock)
    if past is not None and past.acceptance_rate is not None \
            and recent.acceptance_rate is not None \
            and recent.acceptance_rate >= past.acceptance_rate + th.WARMING_RISE_MIN \
            and slower is None:
        return found("SPEC-SPEEDUP-WARMING", "warn", evidence, where=where,
                     past_acceptance=past.acceptance_rate,
                     recent_acceptance=recent.acceptance_rate)
    return _loss(recent, clock, base, evidence, where, slower)


def _loss(recent: Breakdown, clock: str, base: float, evidence: Evidence, where: str | None,
          slower: tuple[float, str] | None) -> Finding:
    """``SPEC-SPEEDUP-LOSS``, with which part of the cycle costs more than the plain steps its
    tokens replace. Per sequence, a plain decode step yields one token in 1/baseline seconds; a
    cycle yields E tokens in t_cycle."""
    host_cycle = recent.cycle_mean_seconds.get("host")
    seq = recent.sequence_tokens_per_second
    tokens = seq * host_cycle if seq is not None and host_cycle is not None else None
    step = 1.0 / base
    evidence["tokens_per_sequence_cycle"] = tokens
    evidence["baseline_step_seconds"] = step
    verify, draft = recent.stats.get(("verify", clock)), recent.stats.get(("draft", clock))
    v = verify.mean_seconds if verify is not None else None
    d = draft.mean_seconds if draft is not None else None
    old = evidence["predicted_one_verify_per_plain_step"]
    facts: dict[str, Any] = {
        "where": where, "draft_seconds": d, "verify_seconds": v,
        "slower_phase": slower[1] if slower else None,
        "slower_factor": slower[0] if slower else None,
    }
    variant = _loss_reason(tokens, d, v, step, old)
    if tokens is not None and v is not None:
        facts.update(replaced_seconds=tokens * step, verify_steps=v / step)
        if d is not None:
            facts.update(draft_of_verify=d / v, tokens_needed=(d + v) / v,
                         cycle_phases_seconds=d + v)
    other = (host_cycle - d - v) if host_cycle is not None and d is not None \
        and v is not None and clock == "host" else None
    facts.update(other_seconds=other, host_cycle_seconds=host_cycle)
    advice = f"{variant}-slower" if slower is not None and variant in ("verify", "both") \
        else None
    return found("SPEC-SPEEDUP-LOSS", "fail", evidence, variant, advice=advice, **facts)


def _loss_reason(tokens: float | None, d: float | None, v: float | None, step: float,
                 old: float | str | None) -> str:
    """Which part of the cycle loses: ``acceptance`` too low for the draft's cost (the clock's
    own prediction is below 1), ``verify`` alone costing more than the steps it replaces,
    ``both`` draft and verify together, else the time ``outside`` them."""
    if tokens is not None and d is not None and v is not None and isinstance(old, float) \
            and old < 1.0:
        return "acceptance"
    if v is not None and tokens is not None and v > tokens * step:
        return "verify"
    if d is not None and v is not None and tokens is not None and d + v > tokens * step:
        return "both"
    return "outside"


# -- time between cycles --------------------------------------------------------------------------


def between_cycles(recent: Breakdown, past: Breakdown | None = None) -> Finding | None:
    """``SPEC-GAP-HIGH`` (warn) when the engine's steady time between cycles (the mean gap from
    the end of one cycle to the begin of the next on its thread, idle gaps left out; the median
    where a few long waits skew the mean past ``GAP_SKEW`` times it) is more than
    ``GAP_MAX_SHARE`` of a cycle and its gap: the scheduler, detokenisation or Python outside
    the instrumented step cost tokens/s that the cycle breakdown does not show; ``SPEC-GAP-OK``
    otherwise; ``None`` where the endpoint exports no gaps or too few."""
    mean, med = recent.gap_mean_seconds, recent.gap_median_seconds
    cycle = recent.cycle_mean_seconds.get("host")
    if mean is None or cycle is None or not cycle > 0 or recent.gap_count < th.MIN_CLOCK_CYCLES:
        return None
    # A few long gaps (the engine waiting for work, under the idle bound) pull the mean far
    # above the median: the steady gap is the median then.
    steady = med if med is not None and mean > th.GAP_SKEW * med else mean
    share = steady / (steady + cycle)
    evidence: Evidence = {
        "gap_steady_seconds": steady, "gap_median_seconds": med, "gap_mean_seconds": mean,
        "gap_share": share, "gap_share_of_busy_time": recent.gap_share,
        "cycle_seconds": cycle, "gaps": recent.gap_count, "idle_gaps": recent.idle_gaps,
    }
    if past is not None and past.gap_mean_seconds and past.gap_count >= th.MIN_CLOCK_CYCLES:
        evidence["gap_against_past"] = mean / past.gap_mean_seconds
    realized, _ = speedups(recent)
    if realized is not None:
        # The baseline is a plain step's own time; the engine pays the gap on top of each cycle.
        evidence["realized_over_wall_time"] = realized * cycle / (cycle + steady)
    if share > th.GAP_MAX_SHARE:
        return found("SPEC-GAP-HIGH", "warn", evidence, realized=realized)
    return found("SPEC-GAP-OK", "ok", evidence, realized=realized)
