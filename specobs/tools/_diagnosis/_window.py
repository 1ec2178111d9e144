"""The classifiers of one window: the acceptance profile, where the cycle goes, whether the
host holds the GPU back, a stall, and the speedup with its reason."""

from __future__ import annotations

import math
from statistics import median

from specobs.tools._breakdown import Breakdown, ratio, speedups
from specobs.tools._diagnosis._compare import slower_by
from specobs.tools._diagnosis._cost import Prediction
from specobs.tools._diagnosis._findings import Finding, Window, _clock, _ms, _n, _pct, _x
from specobs.tools._diagnosis._thresholds import (
    BOOKKEEPING_MAX_SHARE,
    BOUND_SHARE,
    CHAIN_MIN,
    COLLAPSE_RECOVERY,
    FIRST_POSITION_MIN,
    GAP_GREW,
    GAP_MAX_SHARE,
    GAP_SKEW,
    HOST_GAP_MIN,
    LOCKSTEP_MAX,
    MIN_CLOCK_CYCLES,
    MIN_DRAFTED_TOKENS,
    MIN_SPEEDUP_CYCLES,
    WARMING_RISE_MIN,
)

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


# -- where the cycle goes -------------------------------------------------------------------------


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


def _slower_phase(recent: Breakdown, past: Breakdown | None, clock: str) -> str | None:
    """``"verify 2.80x slower than over the lifetime"`` when draft or verify got slower on
    ``clock`` by the phase findings' own test (:func:`slower_by`; the larger factor), else
    ``None``: a loss a slower phase explains is not the draft warming up."""
    if past is None:
        return None
    factors = [(f, p) for p in ("draft", "verify")
               if (f := slower_by(past, recent, p, clock)) is not None]
    if not factors:
        return None
    factor, phase = max(factors)
    return f"{phase} {factor:.2f}x slower than over the lifetime"


def speedup(recent: Breakdown, past: Breakdown | None = None,
            prediction: Prediction | None = None) -> Finding:
    """Realized against predicted against the baseline, and below 1 the reason from the data.
    ``prediction``: the cost model's (:func:`specobs.tools._diagnosis.predict`); where the two
    differ by more than :data:`~specobs.tools._diagnosis.CALIBRATION_TOLERANCE` the sentence
    says where."""
    realized, by_clock = speedups(recent)
    clock = "gpu" if by_clock.get("gpu") is not None else "host"
    pred = prediction.predicted if prediction is not None else None
    base = recent.baseline_tokens_per_second
    evidence: dict[str, float | str | None] = {
        "realized": realized, "predicted": pred,
        "predicted_one_verify_per_plain_step": by_clock.get(clock), "predicted_clock": clock,
        "sequence_tokens_per_second": recent.sequence_tokens_per_second,
        "baseline_tokens_per_second": base, "mean_batch_size": recent.mean_batch_size,
        "cycles": recent.cycles,
        **(prediction.evidence() if prediction is not None else {}),
    }
    if base is None or realized is None:
        return Finding(
            "SPEC-SPEEDUP-UNKNOWN", "info",
            "no non-speculative baseline to compare with"
            + (f"; the cost model predicts {_x(pred)}" if pred is not None else ""),
            evidence,
            "configure(baseline_tokens_per_second=...) or SPECOBS_BASELINE_TOKENS_PER_SECOND, "
            "measured at the batch size the server runs, or let the engine run plain steps "
            "(a k = 0 band) so that specobs measures one",
        )
    if recent.cycles < MIN_SPEEDUP_CYCLES:
        return Finding(
            "SPEC-SPEEDUP-UNKNOWN", "info",
            f"realized speedup {_x(realized)} over only {recent.cycles:.0f} cycles: too short a "
            f"window to judge ({MIN_SPEEDUP_CYCLES:.0f} needed)",
            evidence, "lengthen the window (--wait)",
        )
    if pred is None:
        model = "no plain step was measured to predict it from"
    else:
        model = f"the cost model predicts {_x(pred)}"
        where = prediction.where(realized) if prediction is not None else None
        if where is not None:
            model += f", off by {(pred / realized - 1) * 100:+.0f}%: {where}"
            evidence["calibration_off"] = pred / realized - 1
    head = (f"{_x(realized)} the baseline's tokens/s per sequence "
            f"({recent.sequence_tokens_per_second or 0:.1f} against {base:.1f} at mean batch "
            f"{recent.mean_batch_size or 0:.1f}; {model})")
    if realized >= 1.0:
        return Finding("SPEC-SPEEDUP-OK", "ok", f"speculation is faster: {head}", evidence)
    slower = _slower_phase(recent, past, clock)
    if past is not None and past.acceptance_rate is not None \
            and recent.acceptance_rate is not None \
            and recent.acceptance_rate >= past.acceptance_rate + WARMING_RISE_MIN \
            and slower is None:
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
    old = by_clock.get(clock)
    if tokens is not None and d is not None and v is not None and old is not None and old < 1.0:
        needed = (d + v) / v
        reason = (f"acceptance is too low for the draft's cost: a cycle yields {tokens:.2f} "
                  f"tokens per sequence, and a draft costing {d / v:.2f} of verify needs more "
                  f"than {needed:.2f}")
        advice = "see the acceptance finding: fix the draft, or turn speculation off"
    elif v is not None and tokens is not None and v > tokens * step:
        reason = (f"verify-bound at batch {recent.mean_batch_size or 0:.1f}: one verify costs "
                  f"{_ms(v)}, more than the {tokens:.2f} plain decode steps "
                  f"({_ms(tokens * step)}) its tokens replace")
        advice = ("speculation stops paying at this batch size: give batches this large k = 0 "
                  "in the engine's batch-size schedule of k (SPEC-ADVICE-SCHEDULE; specobs "
                  "advise prints it), or lower k")
        if slower is not None:
            reason += f" ({slower})"
            advice = "see the phase finding: a phase that got slower, not the batch size"
    elif d is not None and v is not None and tokens is not None and d + v > tokens * step:
        reason = (f"draft and verify together cost {_ms(d + v)} a cycle ({_ms(d)} + {_ms(v)}), "
                  f"more than the {tokens:.2f} plain decode steps ({_ms(tokens * step)}) their "
                  f"tokens replace: one verify costs {v / step:.2f} plain steps")
        advice = ("lower k (a cheaper draft, a shorter verify), or give k = 0 above "
                  "this batch size")
        if slower is not None:
            reason += f" ({slower})"
            advice = "see the phase finding: a phase that got slower"
    else:
        other = (host_cycle - d - v) if host_cycle is not None and d is not None \
            and v is not None and clock == "host" else None
        reason = ("the time outside draft and verify (bookkeeping, host overhead) eats the "
                  f"gain: the {clock} clock predicts {_x(old)}"
                  + (f", and {_ms(other)} of each {_ms(host_cycle)} cycle is neither"
                     if other is not None and host_cycle is not None and other > 0 else ""))
        advice = ("see SPEC-CYCLE-BOOKKEEPING-BOUND and the SPEC-HOST-* finding: bookkeeping, "
                  "or the engine's host work between phases")
    return Finding("SPEC-SPEEDUP-LOSS", "fail",
                   f"speculation is slower than the baseline: {head}; {reason}", evidence,
                   advice)


# -- time between cycles --------------------------------------------------------------------------


def between_cycles(recent: Breakdown, past: Breakdown | None = None) -> Finding | None:
    """``SPEC-GAP-HIGH`` (warn) when the engine's steady time between cycles (the mean gap from
    the end of one cycle to the begin of the next on its thread, idle gaps left out; the median
    where a few long waits skew the mean past :data:`GAP_SKEW` times it) is
    more than :data:`GAP_MAX_SHARE` of a cycle and its gap: the scheduler, detokenisation or
    Python outside the instrumented step cost tokens/s that the cycle breakdown does not show;
    ``SPEC-GAP-OK`` otherwise; ``None`` where the endpoint exports no gaps or too few."""
    mean, med = recent.gap_mean_seconds, recent.gap_median_seconds
    cycle = recent.cycle_mean_seconds.get("host")
    if mean is None or cycle is None or not cycle > 0 or recent.gap_count < MIN_CLOCK_CYCLES:
        return None
    # A few long gaps (the engine waiting for work, under the idle bound) pull the mean far
    # above the median: the steady gap is the median then.
    steady = med if med is not None and mean > GAP_SKEW * med else mean
    share = steady / (steady + cycle)
    evidence: dict[str, float | str | None] = {
        "gap_steady_seconds": steady, "gap_median_seconds": med, "gap_mean_seconds": mean,
        "gap_share": share, "gap_share_of_busy_time": recent.gap_share,
        "cycle_seconds": cycle, "gaps": recent.gap_count, "idle_gaps": recent.idle_gaps,
    }
    grown = ""
    if past is not None and past.gap_mean_seconds and past.gap_count >= MIN_CLOCK_CYCLES:
        factor = mean / past.gap_mean_seconds
        evidence["gap_against_past"] = factor
        if factor >= GAP_GREW:
            grown = f", {factor:.1f}x what it was before"
    realized, _ = speedups(recent)
    wall = ""
    if realized is not None:
        # The baseline is a plain step's own time; the engine pays the gap on top of each cycle.
        wall_speedup = realized * cycle / (cycle + steady)
        evidence["realized_over_wall_time"] = wall_speedup
        wall = (f"; against the baseline the {_x(realized)} speedup of the cycles is "
                f"{_x(wall_speedup)} over wall time (a plain decoder paying the same gap a "
                "step would lose more)")
    text = (f"the engine spends {_pct(share)} of its busy time between cycles ({_ms(steady)} "
            f"a gap per {_ms(cycle)} cycle{grown}): tokens/s per sequence is "
            f"{_pct(share)} below what its cycles give{wall}")
    if share > GAP_MAX_SHARE:
        return Finding(
            "SPEC-GAP-HIGH", "warn", text, evidence,
            "profile the engine's loop between steps (py-spy on the worker): the scheduler, "
            "detokenisation, output processing or logging on the step's thread; async "
            "scheduling (vLLM --async-scheduling, SGLang's overlap scheduler) hides it",
        )
    return Finding("SPEC-GAP-OK", "ok", text, evidence)
