"""The comparisons: the recent window against a past (the lifetime before it, or a run saved
earlier) and one server against its cohort, each finding with the size of the change."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

from specobs.tools._breakdown import Breakdown, PhaseStats
from specobs.tools._diagnosis import _thresholds as th
from specobs.tools._diagnosis._findings import Evidence, Finding, _mean
from specobs.tools._diagnosis._words import found

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
    if recent.cycles < th.MIN_RECENT_CYCLES or past.cycles < th.MIN_PAST_CYCLES:
        return []
    ref = reference
    out: list[Finding] = []
    down = _accept_down(recent, past, drafted, ref)
    if down is not None:
        out.append(down)
    clock = "gpu" if recent.cycle_counts.get("gpu", 0.0) >= th.MIN_CLOCK_CYCLES and \
        past.cycle_counts.get("gpu", 0.0) >= th.MIN_CLOCK_CYCLES else "host"
    past_cycle = past.cycle_mean_seconds.get(clock)
    changes: dict[str, tuple[float, float]] = {}
    for p in recent.phases:
        a, b = _mean(past, p, clock), _mean(recent, p, clock)
        if a is not None and b is not None and a > 0:
            changes[p] = (a, b)
    if changes and past_cycle:
        out.extend(_phase_changes(changes, past_cycle, clock, past, recent, ref))
    down_by = _throughput_down(recent, past, out, ref)
    if down_by is not None:
        out.append(down_by)
    if not out:
        out.append(_steady(recent, past, ref))
    return out


def _throughput_down(recent: Breakdown, past: Breakdown, found_so_far: list[Finding],
                     ref: Reference) -> Finding | None:
    """``<prefix>-THROUGHPUT-DOWN`` when per-sequence tokens/s fell below
    ``THROUGHPUT_DROP`` of the past: a warning where a finding about the speculation explains
    it or it fell below ``THROUGHPUT_SEVERE`` with nothing else found, else info."""
    pt, rt = past.sequence_tokens_per_second, recent.sequence_tokens_per_second
    if pt is None or rt is None or not rt < pt * th.THROUGHPUT_DROP:
        return None
    explained = [f for f in found_so_far
                 if f.code.removeprefix(ref.prefix + "-") not in NOT_THE_SPECULATION]
    severe = not found_so_far and rt < pt * th.THROUGHPUT_SEVERE
    return found(f"{ref.prefix}-THROUGHPUT-DOWN", "warn" if explained or severe else "info",
                 {"past": pt, "recent": rt},
                 advice=None if found_so_far else "unexplained",
                 over=ref.over, seconds=recent.elapsed_seconds, change=(rt / pt - 1) * 100)


def _steady(recent: Breakdown, past: Breakdown, ref: Reference) -> Finding:
    return found(f"{ref.prefix}-STEADY", "ok",
                 {"past": past.acceptance_rate, "recent": recent.acceptance_rate},
                 seconds=recent.elapsed_seconds, reference=ref.name)


def _accept_down(recent: Breakdown, past: Breakdown, drafted: tuple[float, float] | None,
                 ref: Reference) -> Finding | None:
    """``<prefix>-ACCEPT-DOWN`` when acceptance fell by a drop worth a finding."""
    pa, ra = past.acceptance_rate, recent.acceptance_rate
    below, z = _acceptance_below(pa, ra, drafted)
    if not below or pa is None or ra is None:
        return None
    return found(f"{ref.prefix}-ACCEPT-DOWN", "warn", {"past": pa, "recent": ra, "z": z},
                 over=ref.over, seconds=recent.elapsed_seconds, points=(ra - pa) * 100)


def acceptance_against_past(recent: Breakdown, past: Breakdown, drafts: tuple[float, float],
                            reference: Reference = LIFETIME) -> list[Finding]:
    """Acceptance alone against the past, for a server read through its engine's own series
    (no cycles, no phases): ``drafts`` (past, recent), the verify steps of one sequence that
    drafted, stand in for the cycles :func:`against_past` needs, and are the counts of the
    z score. Empty when either side drafted too little."""
    if drafts[1] < th.MIN_RECENT_CYCLES or drafts[0] < th.MIN_PAST_CYCLES:
        return []
    down = _accept_down(recent, past, drafts, reference)
    if down is not None:
        return [down]
    return [_steady(recent, past, reference)]


#: Recent findings (codes without their prefix) that explain a slowdown by the machine, not by
#: the speculation.
NOT_THE_SPECULATION = frozenset({"SLOWER-ALL", "HOST-BUSY"})


def _acceptance_below(reference: float | None, rate: float | None,
                      drafted: tuple[float, float] | None) -> tuple[bool, float | None]:
    """Whether ``rate`` is below ``reference`` by a drop worth a finding (at least
    ACCEPT_DROP_MIN, and a z score of ACCEPT_DROP_Z where the drafted counts give one), and
    that z score (None without counts)."""
    if reference is None or rate is None or reference - rate < th.ACCEPT_DROP_MIN:
        return False, None
    z = _z(reference, rate, drafted)
    return z is None or z >= th.ACCEPT_DROP_Z, z


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
    return z is None or z >= th.SLOWER_Z


def _slowed(past_mean: float, recent_mean: float, past_cycle: float, z: float | None) -> bool:
    """A phase mean that rose enough for a finding: SLOWER_RATIO times, by SLOWER_CYCLE_FRACTION
    of the past cycle, beyond noise."""
    return (recent_mean >= th.SLOWER_RATIO * past_mean
            and recent_mean - past_mean >= th.SLOWER_CYCLE_FRACTION * past_cycle
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
    """The findings of phases that got slower: a busy host, the whole machine, a cost per
    boundary, or each slowed phase on its own; empty where none slowed."""
    zs = {p: shift_z(past.stats.get((p, clock)), recent.stats.get((p, clock))) for p in changes}
    slowed = [p for p, (a, b) in changes.items() if _slowed(a, b, past_cycle, zs[p])]
    if not slowed:
        return []
    evidence: Evidence = {"clock": clock, "past_batch": past.mean_batch_size,
                          "recent_batch": recent.mean_batch_size}
    for p, (a, b) in changes.items():
        evidence[f"{p}_past_seconds"] = a
        evidence[f"{p}_recent_seconds"] = b
        z = zs[p]
        # JSON has no infinity: a rise over two spreads of 0 is reported without a z.
        evidence[f"{p}_shift_z"] = z if z is not None and math.isfinite(z) else None
    busy = _host_busy(changes, clock, past, recent, evidence, ref)
    if busy is not None:
        return [busy]
    evidence.update(_fits(changes, slowed))
    words = {"over": ref.over}
    if _machine_slowed(changes, past_cycle, evidence):
        return [found(f"{ref.prefix}-SLOWER-ALL", "info", evidence, **words)]
    if _boundary_cost(changes, slowed, evidence):
        return [found(f"{ref.prefix}-BOUNDARY-COST", "warn", evidence,
                      names=" and ".join(slowed), **words)]
    ratios = {p: b / a for p, (a, b) in changes.items()}
    top = max(ratios[p] for p in slowed)
    shown = [p for p in slowed if ratios[p] >= th.DOMINANT_FRACTION * top]
    others = [ratios[p] for p in ratios if p not in shown]
    reference = median(others) if others else 1.0
    return [found(f"{ref.prefix}-PHASE-SLOWER", "warn",
                  {**evidence, "phase": p, "ratio": ratios[p]}, phase_past=changes[p][0],
                  phase_recent=changes[p][1], others_changed=reference, **words)
            for p in sorted(shown, key=lambda p: -ratios[p])]


def _fits(changes: dict[str, tuple[float, float]], slowed: list[str]) -> Evidence:
    """Two explanations, fitted by least squares to the phase means: the whole machine slowed
    (every phase times one factor r) or a fixed cost was added at the boundaries of the slowed
    phases (each slowed phase plus one time c, the others unchanged)."""
    added = {p: b - a for p, (a, b) in changes.items()}
    r = math.fsum(a * b for a, b in changes.values()) / math.fsum(a * a for a, _ in
                                                                   changes.values())
    sse_uniform = math.fsum((b - r * a) ** 2 for a, b in changes.values())
    unchanged = math.fsum(added[p] ** 2 for p in changes if p not in slowed)
    c = math.fsum(added[p] for p in slowed) / len(slowed)
    sse_boundary = unchanged + math.fsum((added[p] - c) ** 2 for p in slowed)
    return {"uniform_factor": r, "uniform_squared_error": sse_uniform, "boundary_seconds": c,
            "boundary_squared_error": sse_boundary}


def _machine_slowed(changes: dict[str, tuple[float, float]], past_cycle: float,
                    fit: Evidence) -> bool:
    """The whole machine: every phase of any size slowed by a like factor and one factor fits
    at least twice as well as a cost per boundary, or every such phase slowed by a wider spread
    of factors and one factor still fits at least as well (preemption by other work on the
    host)."""
    r, sse_u, sse_b = fit["uniform_factor"], fit["uniform_squared_error"], \
        fit["boundary_squared_error"]
    assert isinstance(r, float) and isinstance(sse_u, float) and isinstance(sse_b, float)
    large = [b / a for a, b in changes.values() if a >= th.UNIFORM_MIN_SHARE * past_cycle]
    alike = bool(large) and max(large) <= th.UNIFORM_SPREAD * min(large)
    everywhere = bool(large) and min(large) >= th.EVERY_PHASE_MIN_RATIO and \
        max(large) <= th.MACHINE_SPREAD * min(large)
    return r >= th.SLOWER_RATIO and ((alike and 2 * sse_u <= sse_b)
                                     or (everywhere and sse_u <= sse_b))


def _boundary_cost(changes: dict[str, tuple[float, float]], slowed: list[str],
                   fit: Evidence) -> bool:
    """A cost per boundary: two or more slowed phases gained like times, and one added time
    fits the phase means better than one factor."""
    amounts = [changes[p][1] - changes[p][0] for p in slowed]
    even = max(amounts) <= th.BOUNDARY_SPREAD * min(amounts)
    sse_u, sse_b = fit["uniform_squared_error"], fit["boundary_squared_error"]
    assert isinstance(sse_u, float) and isinstance(sse_b, float)
    return len(slowed) >= 2 and even and sse_b < sse_u


def _host_busy(changes: dict[str, tuple[float, float]], clock: str, past: Breakdown,
               recent: Breakdown, evidence: Evidence, ref: Reference) -> Finding | None:
    """The phases' added time is what the recording thread spent runnable but off a CPU (Linux
    schedstat, ``specobs_worker_thread_time{state="waiting"}``): a host busy with other work, not
    a phase or a boundary of the speculation. ``None`` without that counter, when the wait
    explains less than ``HOST_WAIT_EXPLAINS`` of the added time, and on the GPU clock: the
    device's time between two events is not the CPU the thread waited for (a host late with its
    launches shows on the host clock, and as ``SPEC-HOST-BOUND``)."""
    if clock != "host":
        return None
    pw, rw = past.worker_waiting_seconds_per_cycle, recent.worker_waiting_seconds_per_cycle
    added = math.fsum(max(0.0, b - a) for a, b in changes.values())
    if pw is None or rw is None or added <= 0 or rw - pw < th.HOST_WAIT_EXPLAINS * added:
        return None
    return found(f"{ref.prefix}-HOST-BUSY", "info",
                 {**evidence, "past_wait_seconds": pw, "recent_wait_seconds": rw,
                  "added_seconds": added},
                 over=ref.over, seconds=recent.elapsed_seconds,
                 wait_share=min(1.0, (rw - pw) / added))


# -- against the cohort ---------------------------------------------------------------------------


def against_cohort(b: Breakdown, cohort: Breakdown, peers: int, name: str,
                   drafted: tuple[float, float] | None = None) -> list[Finding]:
    """One server's window against the same window of the other servers of its cohort (the
    same model and engine, and cluster and namespace where the labels say), summed: ``peers``
    of them, ``name`` saying which in the sentences. ``drafted``: first-position drafted tokens
    (server, cohort) for the acceptance test's z score. Empty when either side has too few
    cycles."""
    if b.cycles < th.MIN_RECENT_CYCLES or cohort.cycles < th.MIN_RECENT_CYCLES or peers < 1:
        return []
    out: list[Finding] = []
    others = f"the other {peers} server{'s' if peers != 1 else ''} of {name}"
    ca, ra = cohort.acceptance_rate, b.acceptance_rate
    below, z = _acceptance_below(ca, ra, drafted)
    if below and ca is not None and ra is not None:
        out.append(found("SPEC-COHORT-ACCEPT-BELOW", "warn",
                         {"server": ra, "cohort": ca, "peers": float(peers), "z": z},
                         others=others, points=(ra - ca) * 100))
    clock = "gpu" if b.cycle_counts.get("gpu", 0.0) >= th.MIN_CLOCK_CYCLES and \
        cohort.cycle_counts.get("gpu", 0.0) >= th.MIN_CLOCK_CYCLES else "host"
    mine, theirs = b.mean_batch_size, cohort.mean_batch_size
    bigger_batch = mine is not None and theirs is not None and \
        mine > th.COHORT_BATCH_TOLERANCE * theirs
    slower = []
    for p in b.phases:
        x, y = _mean(b, p, clock), _mean(cohort, p, clock)
        if x is not None and y is not None and y > 0 and x >= th.COHORT_PHASE_RATIO * y:
            slower.append((x / y, p, x, y))
    if slower and not bigger_batch:
        slower.sort(reverse=True)
        ratio, phase, x, y = slower[0]
        out.append(found(
            "SPEC-COHORT-PHASE-SLOWER", "warn",
            {"phase": phase, "ratio": ratio, "server_seconds": x, "cohort_seconds": y,
             "clock": clock, "server_batch": mine, "cohort_batch": theirs,
             "peers": float(peers)},
            others=others, also=", ".join(f"{p} {r:.1f}x" for r, p, _, _ in slower[1:])))
    if not out:
        out.append(found("SPEC-COHORT-MATCHES", "ok",
                         {"server": ra, "cohort": ca, "peers": float(peers)}, others=others))
    return out
