"""The comparisons: the recent window against a past (the lifetime before it, or a run saved
earlier) and one server against its cohort, each finding with the size of the change."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

from specobs.tools._breakdown import Breakdown, PhaseStats
from specobs.tools._diagnosis._findings import Finding, _mean, _ms, _pct
from specobs.tools._diagnosis._thresholds import (
    ACCEPT_DROP_MIN,
    ACCEPT_DROP_Z,
    BOUNDARY_SPREAD,
    COHORT_BATCH_TOLERANCE,
    COHORT_PHASE_RATIO,
    DOMINANT_FRACTION,
    EVERY_PHASE_MIN_RATIO,
    HOST_WAIT_EXPLAINS,
    MACHINE_SPREAD,
    MIN_CLOCK_CYCLES,
    MIN_PAST_CYCLES,
    MIN_RECENT_CYCLES,
    SLOWER_CYCLE_FRACTION,
    SLOWER_RATIO,
    SLOWER_Z,
    THROUGHPUT_DROP,
    THROUGHPUT_SEVERE,
    UNIFORM_MIN_SHARE,
    UNIFORM_SPREAD,
)

__all__ = [
    "LIFETIME", "NOT_THE_SPECULATION", "Reference", "acceptance_against_past", "against_cohort",
    "against_past", "saved_run", "shift_z",
]


# -- the recent window against its own past -------------------------------------------------------


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
    down = _accept_down(recent, past, drafted, ref)
    if down is not None:
        out.append(down)
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
            f"{ref.prefix}-THROUGHPUT-DOWN",
            "warn" if explained or (not out and rt < pt * THROUGHPUT_SEVERE) else "info",
            f"per-sequence tokens/s fell from {pt:.1f} {ref.over} to {rt:.1f} in the last "
            f"{recent.elapsed_seconds:.1f} s ({(rt / pt - 1) * 100:+.0f}%)",
            {"past": pt, "recent": rt},
            "the other recent findings say why" if out else
            "neither acceptance nor a phase explains it: the batch, the prompt mix or the "
            "machine changed",
        ))
    if not out:
        out.append(Finding(f"{ref.prefix}-STEADY", "ok",
                           f"the last {recent.elapsed_seconds:.1f} s match {ref.name} "
                           f"(acceptance {_pct(pa)} → {_pct(ra)})", {"past": pa, "recent": ra}))
    return out


def _accept_down(recent: Breakdown, past: Breakdown, drafted: tuple[float, float] | None,
                 ref: Reference) -> Finding | None:
    """``<prefix>-ACCEPT-DOWN`` when acceptance fell by a drop worth a finding."""
    pa, ra = past.acceptance_rate, recent.acceptance_rate
    found, z = _acceptance_below(pa, ra, drafted)
    if not found or pa is None or ra is None:
        return None
    return Finding(
        f"{ref.prefix}-ACCEPT-DOWN", "warn",
        f"acceptance fell from {_pct(pa)} {ref.over} to {_pct(ra)} in the last "
        f"{recent.elapsed_seconds:.1f} s ({(ra - pa) * 100:+.0f} points)",
        {"past": pa, "recent": ra, "z": z},
        "something changed in the draft or the traffic: a deploy, a new draft "
        "checkpoint, a different prompt mix; see the acceptance profile",
    )


def acceptance_against_past(recent: Breakdown, past: Breakdown, drafts: tuple[float, float],
                            reference: Reference = LIFETIME) -> list[Finding]:
    """Acceptance alone against the past, for a server read through its engine's own series
    (no cycles, no phases): ``drafts`` (past, recent), the verify steps of one sequence that
    drafted, stand in for the cycles :func:`against_past` needs, and are the counts of the
    z score. Empty when either side drafted too little."""
    if drafts[1] < MIN_RECENT_CYCLES or drafts[0] < MIN_PAST_CYCLES:
        return []
    down = _accept_down(recent, past, drafts, reference)
    if down is not None:
        return [down]
    pa, ra = past.acceptance_rate, recent.acceptance_rate
    return [Finding(f"{reference.prefix}-STEADY", "ok",
                    f"the last {recent.elapsed_seconds:.1f} s match {reference.name} "
                    f"(acceptance {_pct(pa)} → {_pct(ra)})", {"past": pa, "recent": ra})]


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


def shift_z(past: PhaseStats | None, recent: PhaseStats | None) -> float | None:
    """How many standard errors the recent mean stands above the past one, from each side's
    spread (:func:`~specobs.tools._breakdown.histogram_stdev`) and count; ``None`` where either
    spread is unknown, ``inf`` where both sides' observations each share one bucket."""
    if past is None or recent is None or past.mean_seconds is None \
            or recent.mean_seconds is None or past.stdev_seconds is None \
            or recent.stdev_seconds is None or not past.count > 0 or not recent.count > 0:
        return None
    se = math.sqrt(past.stdev_seconds ** 2 / past.count
                   + recent.stdev_seconds ** 2 / recent.count)
    diff = recent.mean_seconds - past.mean_seconds
    if se == 0:
        return math.inf if diff > 0 else (0.0 if diff == 0 else -math.inf)
    return diff / se


def _beyond_noise(z: float | None) -> bool:
    """A rise of at least SLOWER_Z standard errors, or one whose spread is unknown."""
    return z is None or z >= SLOWER_Z


def _slowed(past_mean: float, recent_mean: float, past_cycle: float, z: float | None) -> bool:
    """A phase mean that rose enough for a finding: SLOWER_RATIO times, by SLOWER_CYCLE_FRACTION
    of the past cycle, beyond noise."""
    return (recent_mean >= SLOWER_RATIO * past_mean
            and recent_mean - past_mean >= SLOWER_CYCLE_FRACTION * past_cycle
            and _beyond_noise(z))


def slower_by(past: Breakdown, recent: Breakdown, phase: str, clock: str) -> float | None:
    """How many times slower ``phase`` is in ``recent`` than in ``past`` on ``clock``, where
    that is a slowdown the phase findings report (:func:`_slowed`); else ``None``."""
    a, b = _mean(past, phase, clock), _mean(recent, phase, clock)
    cycle = past.cycle_mean_seconds.get(clock)
    if a is None or b is None or not a > 0 or not cycle:
        return None
    z = shift_z(past.stats.get((phase, clock)), recent.stats.get((phase, clock)))
    return b / a if _slowed(a, b, cycle, z) else None


def _phase_changes(changes: dict[str, tuple[float, float]], past_cycle: float, clock: str,
                   past: Breakdown, recent: Breakdown, ref: Reference) -> list[Finding]:
    ratios = {p: b / a for p, (a, b) in changes.items()}
    added = {p: b - a for p, (a, b) in changes.items()}
    zs = {p: shift_z(past.stats.get((p, clock)), recent.stats.get((p, clock))) for p in changes}
    slowed = [p for p, (a, b) in changes.items() if _slowed(a, b, past_cycle, zs[p])]
    if not slowed:
        return []
    evidence: dict[str, float | str | None] = {"clock": clock,
                                              "past_batch": past.mean_batch_size,
                                              "recent_batch": recent.mean_batch_size}
    for p, (a, b) in changes.items():
        evidence[f"{p}_past_seconds"] = a
        evidence[f"{p}_recent_seconds"] = b
        z = zs[p]
        # JSON has no infinity: a rise over two spreads of 0 is reported without a z.
        evidence[f"{p}_shift_z"] = z if z is not None and math.isfinite(z) else None
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
    a phase or a boundary of the speculation. ``None`` without that counter, when the wait
    explains less than :data:`HOST_WAIT_EXPLAINS` of the added time, and on the GPU clock: the
    device's time between two events is not the CPU the thread waited for (a host late with its
    launches shows on the host clock, and as ``SPEC-HOST-BOUND``)."""
    if clock != "host":
        return None
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
