"""The diagnosis classifiers (:mod:`specobs.tools._diagnosis`) on constructed intervals, each on
both sides of its thresholds, and on intervals recorded from a real observer.

An interval is built as the counters a scrape difference holds (:class:`Delta`), so every
number goes through the same :func:`specobs.tools._breakdown.breakdown` the tools use."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence

import pytest

import specobs
from specobs import catalog
from specobs.timing import FakeEventClock, FakeGpu
from specobs.tools import _breakdown as bd
from specobs.tools import _diagnosis as dg
from specobs.tools._diagnosis import _thresholds as th
from specobs.tools._scrape import Delta, Series

PHASES = ("draft", "verify", "bookkeeping")


def delta(
    *,
    cycles: float = 1000.0,
    batch: float = 4.0,
    host: Mapping[str, float] | None = None,
    gpu: Mapping[str, float] | None = None,
    gpu_cycles: float = 0.0,
    positions: Sequence[float] = (0.85, 0.83, 0.80, 0.78),
    k: int = 4,
    baseline: float | None = None,
    elapsed: float = 10.0,
    running: float | None = None,
    waiting: float | None = None,
    gpu_clock: str = "auto",
    thread_wait: float | None = None,
) -> Delta:
    """The Delta of an interval: ``cycles`` cycles of ``batch`` sequences drafting ``k`` tokens,
    with the unconditional acceptance ``positions[i]`` at each position and the mean phase times
    (seconds) per clock."""
    host = dict(host if host is not None else {"draft": 2e-3, "verify": 3e-3, "bookkeeping": 2e-4})
    c, g = Series(), Series()
    g.add(catalog.INFO.name, {"phases": ",".join(PHASES), "gpu_clock": gpu_clock}, 1.0)
    seq = cycles * batch
    for clock, means, n in (("host", host, cycles), ("gpu", gpu or {}, gpu_cycles)):
        if not means or not n:
            continue
        for p, m in means.items():
            c.add(catalog.PHASE_DURATION.name + "_sum", {"phase": p, "clock": clock}, m * n)
            c.add(catalog.PHASE_DURATION.name + "_count", {"phase": p, "clock": clock}, n)
        c.add(catalog.CYCLE_DURATION.name + "_sum", {"clock": clock}, sum(means.values()) * n)
        c.add(catalog.CYCLE_DURATION.name + "_count", {"clock": clock}, n)
    c.add(catalog.CYCLES.name, {}, cycles)
    accepted = 0.0
    for i in range(k):
        rate = positions[i] if i < len(positions) else 0.0
        c.add(catalog.DRAFTED_BY_POSITION.name, {"position": str(i)}, seq)
        c.add(catalog.ACCEPTED_BY_POSITION.name, {"position": str(i)}, rate * seq)
        accepted += rate * seq
    c.add(catalog.DRAFT_TOKENS.name, {}, seq * k)
    c.add(catalog.ACCEPTED_TOKENS.name, {}, accepted)
    c.add(catalog.EMITTED_TOKENS.name, {}, accepted + seq)
    c.add(catalog.ACCEPT_LENGTH.name + "_sum", {}, accepted)
    c.add(catalog.ACCEPT_LENGTH.name + "_count", {}, seq)
    c.add(catalog.BATCH_SIZE.name + "_sum", {}, seq)
    c.add(catalog.BATCH_SIZE.name + "_count", {}, cycles)
    if thread_wait is not None:  # seconds per cycle the recording thread waited for a CPU
        c.add(catalog.WORKER_THREAD_TIME.name, {"state": "waiting"}, thread_wait * cycles)
        c.add(catalog.WORKER_THREAD_TIME.name, {"state": "running"},
              sum(host.values()) * cycles)
    if baseline is not None:
        g.add(catalog.BASELINE_SEQUENCE_TOKENS.name, {"source": "configured"}, baseline)
    if running is not None:
        g.add(catalog.REQUESTS_RUNNING.name, {}, running)
    if waiting is not None:
        g.add(catalog.REQUESTS_WAITING.name, {}, waiting)
    return Delta(c, g, elapsed)


def win(**kw: object) -> dg.Window:
    return dg.window(delta(**kw))  # type: ignore[arg-type]


def brk(**kw: object) -> bd.Breakdown:
    return win(**kw).breakdown


def codes(findings: Sequence[dg.Finding]) -> list[str]:
    return [f.code for f in findings]


# -- acceptance profile ---------------------------------------------------------------------------


def test_conditional_acceptance_is_the_ratio_of_the_unconditional_rates() -> None:
    cond = dg.conditional_acceptance(brk(positions=(0.8, 0.4, 0.2, 0.0)))
    assert [p for p, _ in cond] == [0, 1, 2, 3]
    assert [a for _, a in cond] == pytest.approx([0.8, 0.5, 0.5, 0.0])


def test_conditional_acceptance_stops_where_nothing_was_accepted() -> None:
    # Position 1 accepted nothing: position 2's conditional rate is undefined, not 0 / 0.
    cond = dg.conditional_acceptance(brk(positions=(0.5, 0.0, 0.0, 0.0)))
    assert cond == [(0, 0.5), (1, 0.0)]


def test_healthy_decay() -> None:
    w = win()
    f = dg.acceptance_profile(w.breakdown, w.drafted_first)
    assert (f.code, f.severity) == ("SPEC-ACCEPT-HEALTHY", "ok")
    assert "0:85%, 1:98%, 2:96%, 3:98%" in f.sentence
    assert f.evidence["conditional_0"] == pytest.approx(0.85)


def test_collapse_from_the_first_position_names_the_causes() -> None:
    # wrong-hidden-layers on the demo: 18% at the first position, ~100% after it.
    w = win(positions=(0.18, 0.175, 0.175, 0.175))
    f = dg.acceptance_profile(w.breakdown, w.drafted_first)
    assert (f.code, f.severity) == ("SPEC-ACCEPT-COLLAPSE", "fail")
    assert f.sentence.startswith("the draft disagrees with the target from its first token: "
                                 "18% of first drafted tokens are accepted")
    for cause in ("hidden layers", "checkpoint", "tokenizer", "temperature"):
        assert cause in f.advice


def test_flat_low_profile() -> None:
    w = win(positions=(0.4, 0.16, 0.064, 0.0256))
    f = dg.acceptance_profile(w.breakdown, w.drafted_first)
    assert (f.code, f.severity) == ("SPEC-ACCEPT-FLAT-LOW", "warn")
    assert "low at every position (0:40%, 1:40%, 2:40%, 3:40%)" in f.sentence


@pytest.mark.parametrize(("first", "code"), [
    (th.FIRST_POSITION_MIN, "SPEC-ACCEPT-HEALTHY"),
    (th.FIRST_POSITION_MIN - 0.01, "SPEC-ACCEPT-COLLAPSE"),
])
def test_first_position_boundary(first: float, code: str) -> None:
    w = win(positions=(first, first * 0.95, first * 0.9, first * 0.85))
    assert dg.acceptance_profile(w.breakdown, w.drafted_first).code == code


@pytest.mark.parametrize(("later", "code"), [
    (0.5 + th.COLLAPSE_RECOVERY, "SPEC-ACCEPT-COLLAPSE"),
    (0.5 + th.COLLAPSE_RECOVERY - 0.01, "SPEC-ACCEPT-FLAT-LOW"),
])
def test_collapse_against_flat_boundary(later: float, code: str) -> None:
    w = win(positions=(0.5, 0.5 * later, 0.5 * later**2, 0.5 * later**3))
    assert dg.acceptance_profile(w.breakdown, w.drafted_first).code == code


def test_a_chain_that_ends_early_suggests_a_shorter_k() -> None:
    w = win(positions=(0.9, 0.8, 0.3, 0.2))
    f = dg.acceptance_profile(w.breakdown, w.drafted_first)
    assert (f.code, f.severity) == ("SPEC-ACCEPT-CHAIN-SHORT", "info")
    assert "conditional acceptance 37% at position 2" in f.sentence
    assert "try k=2" in f.advice


def test_k1_low_acceptance_has_no_profile_to_read() -> None:
    w = win(positions=(0.3,), k=1)
    f = dg.acceptance_profile(w.breakdown, w.drafted_first)
    assert (f.code, f.severity) == ("SPEC-ACCEPT-LOW", "warn")


@pytest.mark.parametrize(("cycles", "code"), [
    (th.MIN_DRAFTED_TOKENS / 4, "SPEC-ACCEPT-HEALTHY"),
    (th.MIN_DRAFTED_TOKENS / 4 - 1, "SPEC-ACCEPT-UNKNOWN"),
])
def test_too_few_drafted_tokens(cycles: float, code: str) -> None:
    w = win(cycles=cycles)  # batch 4: 4 tokens at the first position per cycle
    assert dg.acceptance_profile(w.breakdown, w.drafted_first).code == code


# -- where the cycle goes -------------------------------------------------------------------------


def test_verify_bound_on_the_gpu_clock_wins_over_the_host_clock() -> None:
    b = brk(host={"draft": 0.1e-3, "verify": 0.1e-3, "bookkeeping": 5e-3},
            gpu={"draft": 1e-3, "verify": 4e-3, "bookkeeping": 0.2e-3}, gpu_cycles=50)
    f = dg.cycle_bound(b)
    assert (f.code, f.severity) == ("SPEC-CYCLE-VERIFY-BOUND", "info")
    assert f.evidence["clock"] == "gpu"
    assert "verify takes 77% of it on the gpu clock" in f.sentence


def test_host_clock_when_the_gpu_timed_too_few_cycles() -> None:
    b = brk(host={"draft": 0.1e-3, "verify": 0.1e-3, "bookkeeping": 5e-3},
            gpu={"draft": 1e-3, "verify": 4e-3, "bookkeeping": 0.2e-3},
            gpu_cycles=th.MIN_CLOCK_CYCLES - 1, gpu_clock="cuda")
    f = dg.cycle_bound(b)
    assert (f.code, f.severity) == ("SPEC-CYCLE-BOOKKEEPING-BOUND", "warn")
    assert "host clock: with CUDA graphs" in f.sentence  # the caveat, since CUDA is up


@pytest.mark.parametrize(("bookkeeping", "code"), [
    (th.BOOKKEEPING_MAX_SHARE, "SPEC-CYCLE-BOOKKEEPING-BOUND"),
    (th.BOOKKEEPING_MAX_SHARE - 0.01, "SPEC-CYCLE-BALANCED"),
])
def test_bookkeeping_boundary(bookkeeping: float, code: str) -> None:
    rest = 1.0 - bookkeeping
    b = brk(host={"draft": rest / 2 * 1e-2, "verify": rest / 2 * 1e-2,
                  "bookkeeping": bookkeeping * 1e-2})
    assert dg.cycle_bound(b).code == code


@pytest.mark.parametrize(("share", "code"), [
    (th.BOUND_SHARE, "SPEC-CYCLE-DRAFT-BOUND"),
    (th.BOUND_SHARE - 0.01, "SPEC-CYCLE-BALANCED"),
])
def test_draft_bound_boundary(share: float, code: str) -> None:
    b = brk(host={"draft": share, "verify": 1 - share, "bookkeeping": 0.0})
    f = dg.cycle_bound(b)
    assert f.code == code
    assert "(host clock:" not in f.sentence  # CPU-only: the host clock is the device's


# -- host-bound -----------------------------------------------------------------------------------


def test_no_gpu_clock_means_host_boundness_is_unseen() -> None:
    assert dg.host_bound(brk()).code == "SPEC-HOST-UNSEEN"


@pytest.mark.parametrize(("gap", "code"), [
    (th.HOST_GAP_MIN, "SPEC-HOST-BOUND"),
    (th.HOST_GAP_MIN - 0.01, "SPEC-HOST-OVERLAPPED"),
])
def test_host_gap_boundary(gap: float, code: str) -> None:
    gpu = {"draft": 2e-3, "verify": 6e-3, "bookkeeping": 0.0}
    host_total = 8e-3 / (1 - gap)
    # Host phases disagree with the GPU's (the host runs ahead), and the host cycle is longer.
    host = {"draft": 0.2e-3, "verify": 0.2e-3, "bookkeeping": host_total - 0.4e-3}
    f = dg.host_bound(brk(host=host, gpu=gpu, gpu_cycles=100))
    assert f.code == code
    if code == "SPEC-HOST-BOUND":
        assert f.severity == "warn" and "synchronize" in f.advice
        assert f.evidence["gap_fraction"] == pytest.approx(gap)


def test_lockstep_host_and_gpu_meet_at_every_boundary() -> None:
    gpu = {"draft": 2e-3, "verify": 6e-3, "bookkeeping": 0.5e-3}
    host = {"draft": 2.05e-3, "verify": 6.05e-3, "bookkeeping": 0.55e-3}
    f = dg.host_bound(brk(host=host, gpu=gpu, gpu_cycles=100))
    assert (f.code, f.severity) == ("SPEC-HOST-LOCKSTEP", "warn")
    apart = f.evidence["phase_disagreement_fraction"]
    assert isinstance(apart, float) and apart <= th.LOCKSTEP_MAX


# -- stall ----------------------------------------------------------------------------------------


def test_stall_is_a_failure_when_requests_are_running() -> None:
    w = win(cycles=0, running=4, waiting=0, elapsed=3.0)
    f = dg.stall(w)
    assert f is not None and (f.code, f.severity) == ("SPEC-STALL", "fail")
    assert f.sentence.startswith("decoding is stalled: 4 requests running and 0 waiting, and no "
                                 "cycle in 3.0 s")
    assert dg.diagnose(w) == [f]


def test_waiting_requests_alone_are_a_stall_too() -> None:
    f = dg.stall(win(cycles=0, running=0, waiting=1))
    assert f is not None and f.code == "SPEC-STALL"


def test_idle_and_unknown() -> None:
    idle = dg.stall(win(cycles=0, running=0, waiting=0))
    assert idle is not None and (idle.code, idle.severity) == ("SPEC-IDLE", "info")
    blind = dg.stall(win(cycles=0))
    assert blind is not None and (blind.code, blind.severity) == ("SPEC-NO-CYCLES", "info")
    assert "set_requests" in blind.advice
    assert dg.stall(win(cycles=1, running=4)) is None


# -- speedup explained ----------------------------------------------------------------------------

# A healthy interval: 4 sequences, cycle 5.2 ms, 1 + 3.26 tokens per sequence-cycle: 819 tok/s.


def test_speedup_ok_and_unknown() -> None:
    f = dg.speedup(brk(baseline=300.0))
    assert (f.code, f.severity) == ("SPEC-SPEEDUP-OK", "ok")
    assert f.sentence.startswith("speculation is faster: 2.73x the baseline's tokens/s")
    none = dg.speedup(brk())
    assert (none.code, none.severity) == ("SPEC-SPEEDUP-UNKNOWN", "info")
    assert none.sentence == "no non-speculative baseline to compare with"
    assert none.evidence["predicted"] is None


@pytest.mark.parametrize(("cycles", "code"), [
    (dg.MIN_SPEEDUP_CYCLES, "SPEC-SPEEDUP-LOSS"),
    (dg.MIN_SPEEDUP_CYCLES - 1, "SPEC-SPEEDUP-UNKNOWN"),
])
def test_window_too_short_boundary(cycles: float, code: str) -> None:
    assert dg.speedup(brk(cycles=cycles, baseline=1e4)).code == code


def test_below_1_because_acceptance_is_too_low_for_the_draft() -> None:
    b = brk(positions=(0.1, 0.01, 0.0, 0.0), host={"draft": 3e-3, "verify": 3e-3,
                                                   "bookkeeping": 0.1e-3}, baseline=300.0)
    f = dg.speedup(b)
    assert (f.code, f.severity) == ("SPEC-SPEEDUP-LOSS", "fail")
    assert "acceptance is too low for the draft's cost" in f.sentence
    assert "a draft costing 1.00 of verify needs more than 2.00" in f.sentence


def test_below_1_because_verify_is_dearer_than_the_steps_it_replaces() -> None:
    # 4.26 tokens per sequence-cycle; a plain step 1/1000 s: verify 5 ms > 4.26 ms.
    b = brk(host={"draft": 0.5e-3, "verify": 5e-3, "bookkeeping": 0.1e-3}, baseline=1000.0)
    f = dg.speedup(b)
    assert f.code == "SPEC-SPEEDUP-LOSS"
    assert "verify-bound at batch 4.0: one verify costs 5.00 ms" in f.sentence
    assert "k = 0 in the engine's batch-size schedule" in f.advice


def test_below_1_because_draft_and_verify_together_cost_more_than_the_steps_they_replace(
) -> None:
    # 4.26 tokens per sequence-cycle, a plain step 1 ms: verify alone (3 ms) pays, draft and
    # verify together (5.5 ms) do not; acceptance is fine for the draft's cost (predicted 2.3x).
    b = brk(host={"draft": 2.5e-3, "verify": 3e-3, "bookkeeping": 0.1e-3}, baseline=1000.0)
    f = dg.speedup(b)
    assert (f.code, f.severity) == ("SPEC-SPEEDUP-LOSS", "fail")
    assert ("draft and verify together cost 5.50 ms a cycle (2.50 ms + 3.00 ms), more than the "
            "4.26 plain decode steps (4.26 ms) their tokens replace: one verify costs 3.00 plain "
            "steps") in f.sentence
    assert "bookkeeping" not in f.sentence and "lower k" in f.advice


def test_below_1_because_of_time_outside_draft_and_verify() -> None:
    b = brk(host={"draft": 0.5e-3, "verify": 1e-3, "bookkeeping": 5e-3}, baseline=1000.0)
    f = dg.speedup(b)
    assert f.code == "SPEC-SPEEDUP-LOSS"
    assert "bookkeeping, host overhead" in f.sentence
    assert "and 5.00 ms of each 6.50 ms cycle is neither" in f.sentence
    assert "SPEC-CYCLE-BOOKKEEPING-BOUND" in f.advice  # a finding that exists


def test_a_loss_a_slower_phase_explains_is_not_the_draft_warming_up() -> None:
    """Acceptance rose, but verify got 3x slower: the loss is the slower verify, named, not a
    draft warming up (the demo said so with its shipped weights under the slow-verify fault)."""
    past = brk(positions=(0.1, 0.05, 0.0, 0.0), baseline=1e4)
    recent = brk(positions=(0.5, 0.4, 0.3, 0.2), baseline=1e4,
                 host={"draft": 2e-3, "verify": 9e-3, "bookkeeping": 2e-4})
    f = dg.speedup(recent, past)
    assert (f.code, f.severity) == ("SPEC-SPEEDUP-LOSS", "fail")
    assert "(verify 3.00x slower than over the lifetime)" in f.sentence
    assert "phase finding" in f.advice
    # The same rise with the phases as they were is still the draft warming up.
    steady = brk(positions=(0.5, 0.4, 0.3, 0.2), baseline=1e4)
    assert dg.speedup(steady, past).code == "SPEC-SPEEDUP-WARMING"


def test_below_1_while_acceptance_rises_is_warming_up() -> None:
    past = brk(positions=(0.1, 0.05, 0.0, 0.0), baseline=1e4)
    recent = brk(positions=(0.5, 0.4, 0.3, 0.2), baseline=1e4)
    f = dg.speedup(recent, past)
    assert (f.code, f.severity) == ("SPEC-SPEEDUP-WARMING", "warn")
    assert "acceptance is still rising (4% over the lifetime, 35% now)" in f.sentence


# -- the recent window against the lifetime -------------------------------------------------------

HEALTHY = {"draft": 2.5e-3, "verify": 3.0e-3, "bookkeeping": 0.2e-3}


def test_steady() -> None:
    out = dg.against_past(brk(cycles=300), brk(cycles=3000))
    assert codes(out) == ["SPEC-RECENT-STEADY"]


def test_acceptance_down_with_its_size() -> None:
    recent = win(cycles=300, positions=(0.18, 0.175, 0.175, 0.175))
    past = win(cycles=3000)
    out = dg.diagnose(recent, past)
    got = {f.code: f for f in out}
    down = got["SPEC-RECENT-ACCEPT-DOWN"]
    assert down.severity == "warn"
    assert down.sentence.startswith("acceptance fell from 82% over the lifetime to 18% in the "
                                    "last 10.0 s (-64 points)")
    assert got["SPEC-RECENT-THROUGHPUT-DOWN"].severity == "warn"
    assert got["SPEC-ACCEPT-COLLAPSE"].severity == "fail"


@pytest.mark.parametrize(("drop", "found"), [
    (th.ACCEPT_DROP_MIN + 0.005, True),
    (th.ACCEPT_DROP_MIN - 0.005, False),
])
def test_acceptance_drop_boundary(drop: float, found: bool) -> None:
    base = (0.8, 0.8, 0.8, 0.8)
    recent = tuple(a - drop for a in base)
    out = dg.against_past(brk(cycles=2000, positions=recent), brk(cycles=20000, positions=base),
                          drafted=(80000.0, 8000.0))
    assert ("SPEC-RECENT-ACCEPT-DOWN" in codes(out)) is found


def test_a_drop_within_the_noise_of_few_tokens_is_not_reported() -> None:
    out = dg.against_past(brk(cycles=300, positions=(0.6,) * 4), brk(cycles=3000,
                          positions=(0.8,) * 4), drafted=(30.0, 3.0))
    assert "SPEC-RECENT-ACCEPT-DOWN" not in codes(out)


def observed(per_phase: Mapping[str, Sequence[float]], **kw: object) -> bd.Breakdown:
    """The breakdown of a window whose host-clock phases took ``per_phase`` seconds, cycle by
    cycle, with their histograms' buckets (catalog.DURATION_BUCKETS_SECONDS) as a scrape gives."""
    n = {len(v) for v in per_phase.values()}
    assert len(n) == 1
    d = delta(cycles=float(n.pop()), host={p: statistics.fmean(v) for p, v in per_phase.items()},
              **kw)  # type: ignore[arg-type]
    for p, values in per_phase.items():
        for le in (*catalog.DURATION_BUCKETS_SECONDS, math.inf):
            d.counters.add(catalog.PHASE_DURATION.name + "_bucket",
                           {"phase": p, "clock": "host", "le": "+Inf" if le == math.inf
                            else repr(le)}, float(sum(1 for v in values if v <= le)))
    return dg.window(d).breakdown


def test_a_stall_in_one_phase_is_not_that_phase_getting_slower() -> None:
    # 80 cycles like the 3000 before them but for one 200 ms stall inside verify (a loaded
    # 2-core machine, a collection pause): verify's mean 1.27x the past one's and 2.4 ms more,
    # past SLOWER_RATIO and SLOWER_CYCLE_FRACTION; but the rise is one cycle in a distant
    # bucket, 1.1 standard errors of the difference, not a phase that got slower.
    past = observed({"draft": [8e-3] * 3000, "verify": [9e-3] * 3000,
                     "bookkeeping": [0.3e-3] * 3000})
    stalled = observed({"draft": [8e-3] * 80, "verify": [9e-3] * 79 + [0.2],
                        "bookkeeping": [0.3e-3] * 80})
    verify = stalled.stats[("verify", "host")]
    assert verify.mean_seconds / 9e-3 >= th.SLOWER_RATIO  # type: ignore[operator]
    z = dg.shift_z(past.stats[("verify", "host")], verify)
    assert z is not None and 0.5 < z < th.SLOWER_Z
    out = dg.against_past(stalled, past)
    assert codes(out) == ["SPEC-RECENT-STEADY"], out
    # Every cycle's verify 1.28x slower (a bucket further up): named, its z without bound.
    slower = observed({"draft": [8e-3] * 80, "verify": [11.5e-3] * 80,
                       "bookkeeping": [0.3e-3] * 80})
    out = dg.against_past(slower, past)
    assert codes(out)[0] == "SPEC-RECENT-PHASE-SLOWER" and out[0].evidence["phase"] == "verify"
    assert dg.shift_z(past.stats[("verify", "host")], slower.stats[("verify", "host")]) \
        == math.inf and out[0].evidence["verify_shift_z"] is None
    # Three stalls of 200 ms: 1.8x the mean, 2.0 standard errors: still the machine, not verify.
    stalls = observed({"draft": [8e-3] * 80, "verify": [9e-3] * 77 + [0.2] * 3,
                       "bookkeeping": [0.3e-3] * 80})
    assert "SPEC-RECENT-PHASE-SLOWER" not in codes(dg.against_past(stalls, past))
    # A slowdown that stands out of its own spread: every cycle 1.2x and a fifth of them at 30 ms
    # (two buckets up), 6.3 standard errors.
    mixed = observed({"draft": [8e-3] * 80, "verify": [10.8e-3] * 64 + [30e-3] * 16,
                      "bookkeeping": [0.3e-3] * 80})
    z = dg.shift_z(past.stats[("verify", "host")], mixed.stats[("verify", "host")])
    assert z is not None and th.SLOWER_Z < z < math.inf
    assert codes(dg.against_past(mixed, past))[0] == "SPEC-RECENT-PHASE-SLOWER"


def test_histogram_stdev_counts_buckets_apart_not_within() -> None:
    inf = math.inf
    assert bd.histogram_stdev({0.005: 0.0, 0.01: 80.0, inf: 80.0}) == 0.0
    # One observation of 80 at the 0.1-0.25 bucket's midpoint, 79 at 7.5 ms.
    got = bd.histogram_stdev({0.005: 0.0, 0.01: 79.0, 0.1: 79.0, 0.25: 80.0, inf: 80.0})
    mids = [0.0075] * 79 + [0.175]
    assert got == pytest.approx(statistics.pstdev(mids))
    # The +Inf bucket sits at the highest finite bound; no buckets, no spread.
    assert bd.histogram_stdev({1.0: 1.0, inf: 2.0}) == pytest.approx(0.25)
    assert bd.histogram_stdev({}) is None and bd.histogram_stdev({1.0: 0.0, inf: 0.0}) is None


def test_one_phase_slower_names_it() -> None:
    slow = {**HEALTHY, "verify": 4 * HEALTHY["verify"]}
    out = dg.against_past(brk(cycles=300, host=slow), brk(cycles=3000, host=HEALTHY))
    f = next(f for f in out if f.code == "SPEC-RECENT-PHASE-SLOWER")
    assert f.severity == "warn" and f.evidence["phase"] == "verify"
    assert f.sentence.startswith("verify is 4.0x slower than over the lifetime (3.00 ms → 12.00 "
                                 "ms per cycle, host clock) while the other phases changed 1.00x")
    assert "SPEC-RECENT-THROUGHPUT-DOWN" in codes(out)


def test_the_same_time_at_each_boundary_is_a_boundary_cost() -> None:
    # sync-between-phases on the CPU demo: 2 ms more in draft and in verify, bookkeeping as was.
    slow = {"draft": 4.5e-3, "verify": 5.0e-3, "bookkeeping": 0.2e-3}
    out = dg.against_past(brk(cycles=300, host=slow), brk(cycles=3000, host=HEALTHY))
    f = next(f for f in out if f.code == "SPEC-RECENT-BOUNDARY-COST")
    assert f.severity == "warn" and "synchronize" in f.advice
    assert f.sentence.startswith("draft and verify are each about 2.00 ms slower per cycle")


def test_sync_between_phases_as_recorded_on_the_cpu_demo() -> None:
    """The means one doctor run read on the CPU demo (lifetime, then 3 s with the fault on): the
    factors are alike (1.46, 1.27, 1.36), but one added time fits far better than one factor."""
    past = {"draft": 5.35e-3, "verify": 7.70e-3, "bookkeeping": 0.28e-3}
    recent = {"draft": 7.80e-3, "verify": 9.79e-3, "bookkeeping": 0.38e-3}
    out = dg.against_past(brk(cycles=300, host=recent), brk(cycles=3000, host=past))
    assert codes(out)[0] == "SPEC-RECENT-BOUNDARY-COST"
    assert out[0].evidence["boundary_seconds"] == pytest.approx(2.27e-3)


def test_slow_verify_as_recorded_on_the_cpu_demo() -> None:
    """slow-verify on the CPU demo slowed the draft too (1.5x) while verify went 5.3x: one
    factor fits badly, one added time worse; verify is named, the draft's change is context."""
    past = {"draft": 4.61e-3, "verify": 7.54e-3, "bookkeeping": 0.25e-3}
    recent = {"draft": 7.04e-3, "verify": 40.33e-3, "bookkeeping": 0.37e-3}
    out = dg.against_past(brk(cycles=100, host=recent), brk(cycles=3000, host=past))
    assert codes(out) == ["SPEC-RECENT-PHASE-SLOWER", "SPEC-RECENT-THROUGHPUT-DOWN"]
    assert out[0].sentence.startswith("verify is 5.3x slower than over the lifetime (7.54 ms → "
                                      "40.33 ms per cycle, host clock) while the other phases "
                                      "changed 1.50x")


def test_sync_at_the_end_of_every_phase_as_recorded_on_the_cpu_demo() -> None:
    """The fault as the demo has it (a 5 ms stall at the end of each phase, a sleep, so more
    under load): draft and verify 2.4x, bookkeeping 13x, each about 6 ms more."""
    past = {"draft": 4.18e-3, "verify": 5.13e-3, "bookkeeping": 0.43e-3}
    recent = {"draft": 10.20e-3, "verify": 11.42e-3, "bookkeeping": 5.75e-3}
    out = dg.against_past(brk(cycles=100, host=recent), brk(cycles=3000, host=past))
    assert codes(out) == ["SPEC-RECENT-BOUNDARY-COST", "SPEC-RECENT-THROUGHPUT-DOWN"]
    assert out[0].sentence.startswith("draft and verify and bookkeeping are each about 5.88 ms "
                                      "slower per cycle")


def test_every_phase_slower_alike_is_the_machine_not_the_speculation() -> None:
    slow = {p: 1.8 * m for p, m in HEALTHY.items()}
    out = dg.against_past(brk(cycles=300, host=slow), brk(cycles=3000, host=HEALTHY))
    assert codes(out) == ["SPEC-RECENT-SLOWER-ALL", "SPEC-RECENT-THROUGHPUT-DOWN"]
    assert [f.severity for f in out] == ["info", "info"]
    assert out[0].sentence.startswith("every phase is 1.8x slower than over the lifetime")


def test_time_the_engines_thread_waited_for_a_cpu_is_the_host_not_the_speculation() -> None:
    """Draft and verify each about 5 ms slower (the means alone read as a cost per boundary),
    and the recording thread waited 9 ms more per cycle for a CPU: the host was busy."""
    past = {"draft": 7.87e-3, "verify": 8.86e-3, "bookkeeping": 0.31e-3}
    recent = {"draft": 12.83e-3, "verify": 13.87e-3, "bookkeeping": 0.60e-3}
    alone = dg.against_past(brk(cycles=100, host=recent), brk(cycles=3000, host=past))
    assert codes(alone)[0] == "SPEC-RECENT-BOUNDARY-COST"
    out = dg.against_past(brk(cycles=100, host=recent, thread_wait=9.5e-3),
                          brk(cycles=3000, host=past, thread_wait=0.2e-3))
    assert codes(out) == ["SPEC-RECENT-HOST-BUSY", "SPEC-RECENT-THROUGHPUT-DOWN"]
    assert [f.severity for f in out] == ["info", "info"]
    assert out[0].sentence.startswith("the engine's thread waited 9.50 ms per cycle for a CPU")
    assert out[0].evidence["added_seconds"] == pytest.approx(10.26e-3)
    # A wait that explains under half of what the phases gained leaves the phases' finding.
    out = dg.against_past(brk(cycles=100, host=recent, thread_wait=4.0e-3),
                          brk(cycles=3000, host=past, thread_wait=0.2e-3))
    assert codes(out)[0] == "SPEC-RECENT-BOUNDARY-COST"


def test_on_the_gpu_clock_a_phase_that_got_slower_is_not_the_hosts_wait() -> None:
    """Verify 4x slower on the GPU clock while the engine's thread also waited for a CPU (a
    loaded CI machine did this to the doctor --against test): the CPU the thread waited for is
    not where GPU time went. The thread's wait is read against the host clock only."""
    host = {"draft": 0.3e-3, "verify": 0.3e-3, "bookkeeping": 0.1e-3}
    past_gpu = {"draft": 0.2e-3, "verify": 0.6e-3, "bookkeeping": 0.1e-3}
    recent_gpu = {**past_gpu, "verify": 2.4e-3}
    out = dg.against_past(
        brk(cycles=200, host=host, gpu=recent_gpu, gpu_cycles=200, thread_wait=2.0e-3),
        brk(cycles=3000, host=host, gpu=past_gpu, gpu_cycles=3000, thread_wait=0.1e-3))
    assert codes(out)[0] == "SPEC-RECENT-PHASE-SLOWER", codes(out)
    assert out[0].evidence["clock"] == "gpu" and out[0].evidence["phase"] == "verify"
    assert "SPEC-RECENT-HOST-BUSY" not in codes(out)


def test_a_host_busy_with_other_work_is_the_machine_not_a_boundary_cost() -> None:
    """The healthy CPU demo, its lifetime on an idle machine and the doctor's window with two
    CPU burners on both cores (recorded): the short phases swell by larger factors than the long
    ones (1.34x, 1.60x, 2.09x) and draft and verify gained 2.7 and 5.4 ms — not one time added at
    each boundary, and one factor fits better; the machine, said as information."""
    past = {"draft": 7.950e-3, "verify": 8.947e-3, "bookkeeping": 0.328e-3}
    recent = {"draft": 10.653e-3, "verify": 14.352e-3, "bookkeeping": 0.687e-3}
    out = dg.against_past(brk(cycles=100, host=recent), brk(cycles=3000, host=past))
    assert codes(out) == ["SPEC-RECENT-SLOWER-ALL", "SPEC-RECENT-THROUGHPUT-DOWN"]
    assert [f.severity for f in out] == ["info", "info"]
    # One phase far behind the others is still named: slow-verify's factors spread wider.
    slow = {**recent, "verify": 4 * past["verify"]}
    out = dg.against_past(brk(cycles=100, host=slow), brk(cycles=3000, host=past))
    assert codes(out)[0] == "SPEC-RECENT-PHASE-SLOWER" and out[0].evidence["phase"] == "verify"


@pytest.mark.parametrize(("factor", "slower"), [
    (th.SLOWER_RATIO, True),
    (th.SLOWER_RATIO - 0.02, False),
])
def test_phase_slower_boundary(factor: float, slower: bool) -> None:
    slow = {**HEALTHY, "verify": factor * HEALTHY["verify"]}
    out = dg.against_past(brk(cycles=300, host=slow), brk(cycles=3000, host=HEALTHY))
    assert ("SPEC-RECENT-PHASE-SLOWER" in codes(out)) is slower


@pytest.mark.parametrize(("recent", "past", "compared"), [
    (dg.MIN_RECENT_CYCLES, dg.MIN_PAST_CYCLES, True),
    (dg.MIN_RECENT_CYCLES - 1, dg.MIN_PAST_CYCLES, False),
    (dg.MIN_RECENT_CYCLES, dg.MIN_PAST_CYCLES - 1, False),
])
def test_too_few_cycles_to_compare(recent: float, past: float, compared: bool) -> None:
    assert bool(dg.against_past(brk(cycles=recent), brk(cycles=past))) is compared


# -- the whole diagnosis on a recorded interval ---------------------------------------------------


def test_diagnose_a_recorded_interval_of_a_real_observer() -> None:
    """A real recorder and resolver on the fake GPU clock: draft 1 ms, verify 4 ms on the GPU."""
    gpu = FakeGpu()
    obs = specobs.configure(sinks=[specobs.MemorySink()], clock=FakeEventClock(gpu),
                            sample_every=1, max_draft_length=4, env={})
    try:
        for _ in range(40):
            with obs.cycle(batch_size=4) as c:
                gpu.run(1_000_000)
                c.mark("verify")
                gpu.run(4_000_000)
                c.mark("bookkeeping")
                gpu.run(100_000)
                c.accept([3, 4, 0, 2], draft_length=4)
            gpu.complete()
        assert obs.force_flush(5)
        snap = obs.snapshot()
    finally:
        obs.shutdown(5)
    w = dg.window(bd.snapshot_delta(snap, None, 1.0, baseline=100.0))
    out = {f.code: f for f in dg.diagnose(w)}
    assert out["SPEC-CYCLE-VERIFY-BOUND"].evidence["clock"] == "gpu"
    assert out["SPEC-CYCLE-VERIFY-BOUND"].evidence["verify_share"] == pytest.approx(4 / 5.1)
    assert "SPEC-ACCEPT-UNKNOWN" in out  # 160 drafted at the first position, under 200


def test_worst_and_status_line() -> None:
    ok = dg.Finding("SPEC-ACCEPT-HEALTHY", "ok", "")
    warn = dg.Finding("SPEC-RECENT-PHASE-SLOWER", "warn", "")
    fail = dg.Finding("SPEC-STALL", "fail", "")
    assert dg.worst([]) == "ok" and dg.worst([ok, warn]) == "warn"
    assert dg.status_line([ok]) == "OK: no problem found"
    assert dg.status_line([ok, dg.Finding("SPEC-HOST-UNSEEN", "info", "")]) == \
        "OK: no problem found"
    assert dg.status_line([ok, warn, fail]) == "FAIL: SPEC-STALL"
    assert dg.status_line([warn, ok]) == "WARN: SPEC-RECENT-PHASE-SLOWER"


def test_every_code_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "diagnosis.md").read_text()
    for code in dg.CODES:
        assert f"`{code}`" in doc, code


# -- the advisor ----------------------------------------------------------------------------------


def test_expected_tokens_is_one_plus_the_products_of_the_conditional_rates() -> None:
    assert dg.expected_tokens([0.8, 0.5], 2) == pytest.approx(1 + 0.8 + 0.4)
    # Beyond the measured positions, with one in-cycle rate, that rate is held.
    assert dg.expected_tokens([0.8, 0.5], 3) == pytest.approx(1 + 0.8 + 0.4 + 0.2)
    # The same E the counters give: emitted per sequence-cycle.
    b = brk(positions=(0.8, 0.4, 0.2, 0.1))
    cond = [a for _, a in dg.conditional_acceptance(b)]
    e = b.sequence_tokens_per_second * b.cycle_mean_seconds["host"]  # type: ignore[operator]
    assert dg.expected_tokens(cond, 4) == pytest.approx(e)


def test_beyond_the_measured_positions_a_declining_draft_keeps_declining() -> None:
    # A draft whose conditional acceptance falls 0.05 a position (as a feature-reusing draft's
    # does, its own errors compounding): the line through a_1 .. a_4 continues it exactly,
    # where holding the last measured rate (0.6) would promise 0.6 at every later position.
    measured = [0.8, 0.75, 0.7, 0.65, 0.6]
    assert dg.extended_rates(measured, 8) == pytest.approx([*measured, 0.55, 0.5, 0.45])
    assert dg.extended_rates(measured, 3) == measured[:3]
    assert dg.expected_tokens(measured, 8) < 1 + sum(
        math.prod([*measured, 0.6, 0.6, 0.6][: i + 1]) for i in range(8))
    # Never below 0 however steep.
    assert dg.extended_rates([0.9, 0.8, 0.5, 0.2], 8)[4:] == [0.0, 0.0, 0.0, 0.0]


def test_beyond_the_measured_positions_a_rising_trend_is_held_level() -> None:
    # The weighted level of a_1 .. a_3 (weights: the share of cycles reaching each position),
    # not the rise continued past the best rate measured.
    measured = [0.7, 0.8, 0.85, 0.9]
    w = [0.7, 0.7 * 0.8, 0.7 * 0.8 * 0.85]
    level = (w[0] * 0.8 + w[1] * 0.85 + w[2] * 0.9) / sum(w)
    assert dg.extended_rates(measured, 7)[4:] == pytest.approx([level] * 3)
    # From fewer than TREND_MIN_RATES in-cycle rates, their level alone (no slope from two).
    assert dg.extended_rates([0.9, 0.8, 0.7], 5)[3:] == pytest.approx(
        [(0.9 * 0.8 + 0.72 * 0.7) / (0.9 + 0.72)] * 2)
    # k = 1: a_0 is all there is.
    assert dg.extended_rates([0.6], 3) == [0.6, 0.6, 0.6]


def test_the_trend_reads_the_later_positions_better_than_the_last_rate() -> None:
    # The two-state text's in-cycle rate does not move with the position, but the last
    # position measured has the fewest drafts behind it: over 12 short windows at k = 6, the
    # trend through a_1 .. a_5 misses the positions 6 and 7 measured at k = 8 by less than the
    # last rate held does.
    trend_err, last_err = [], []
    for seed in range(12):
        at6, at8 = markov_acceptance(6, 400, 100 + seed), markov_acceptance(8, 60_000, 7)
        ext = dg.extended_rates(at6, 8)
        trend_err += [abs(ext[i] - at8[i]) for i in (6, 7)]
        last_err += [abs(at6[-1] - at8[i]) for i in (6, 7)]
    assert statistics.fmean(trend_err) < 0.8 * statistics.fmean(last_err)


def measured(per_token: float = 0.0) -> dg.ForwardModel:
    """A forward whose growth with tokens was measured (two token counts seen)."""
    return dg.ForwardModel(1e-3, per_token, (), 2, 0.0)


def test_a_cheap_draft_with_high_acceptance_is_advised_a_longer_k() -> None:
    b = brk(positions=(0.9, 0.85, 0.8, 0.76),
            host={"draft": 0.4e-3, "verify": 2e-3, "bookkeeping": 0.1e-3})
    f = dg.advise_k(b, measured())
    assert f is not None and (f.code, f.severity) == ("SPEC-ADVICE-K", "info")
    assert f.evidence["best_k"] == min(th.ADVICE_MAX_K, 4 + th.ADVICE_BEYOND)
    assert f.evidence["k"] == 4.0
    assert "(extrapolated beyond the measured k)" in f.sentence
    gain = f.evidence["predicted_gain"]
    assert isinstance(gain, float) and gain > th.ADVICE_MIN_GAIN


def test_a_draft_that_loses_the_target_early_is_advised_a_shorter_k() -> None:
    b = brk(positions=(0.8, 0.3, 0.05, 0.01),
            host={"draft": 4e-3, "verify": 3e-3, "bookkeeping": 0.2e-3})
    f = dg.advise_k(b, measured())
    assert f is not None and f.evidence["best_k"] < 4.0
    assert "extrapolated" not in f.sentence


def test_verify_that_grows_with_k_moves_the_advice_down() -> None:
    b = brk(positions=(0.85, 0.83, 0.80, 0.78),
            host={"draft": 2e-3, "verify": 3e-3, "bookkeeping": 0.2e-3})
    # 1: verify proportional to the tokens it computes, 4 x 5 of them at k = 4
    flat, grows = dg.advise_k(b, measured(0.0)), dg.advise_k(b, measured(3e-3 / 20))
    assert flat is not None and grows is not None
    assert grows.evidence["best_k"] <= flat.evidence["best_k"]  # type: ignore[operator]


def test_the_current_k_when_it_is_the_models_best() -> None:
    # Conditional acceptance 0.8 then 0.6 at every later position, a draft step a third of a
    # verify: the model's optimum is the k measured.
    b = brk(positions=(0.8, 0.48, 0.288, 0.1728),
            host={"draft": 1e-3, "verify": 3e-3, "bookkeeping": 0.2e-3})
    f = dg.advise_k(b)
    assert f is not None and (f.code, f.severity) == ("SPEC-ADVICE-K", "ok")
    assert f.evidence["best_k"] == 4.0 and f.evidence["predicted_gain"] == 0.0
    assert f.sentence.startswith("k=4 is the best speculation length")


def markov_acceptance(k: int, cycles: int, seed: int) -> list[float]:
    """Conditional acceptance per position, as the counters give it, of cycles drafting ``k``
    over a text whose tokens the draft gets right 96% of the time after one it got right and
    60% after one it got wrong (hard text comes in runs): a rejected token is hard, and the
    next cycle starts right after it; a cycle accepted whole adds the target's bonus token."""
    rnd, easy = random.Random(seed), True
    drafted, accepted = [0] * k, [0] * k

    def token() -> bool:
        nonlocal easy
        easy = rnd.random() < (0.96 if easy else 0.60)
        return easy

    for _ in range(cycles):
        for i in range(k):
            drafted[i] += 1
            if not token():
                break
            accepted[i] += 1
        else:
            token()
    return [accepted[0] / drafted[0], *(accepted[i] / accepted[i - 1] for i in range(1, k))]


def test_the_first_positions_rate_moves_with_k_as_full_cycles_become_rarer() -> None:
    at4, at8, at2 = (markov_acceptance(k, 60_000, seed) for k, seed in ((4, 1), (8, 2), (2, 3)))
    first = dg.FirstPosition.fit(at4, 4)
    assert first is not None
    # After a whole cycle the target's bonus token comes first: easy with chance 0.96, so the
    # first draft after it is accepted at 0.96 * 0.96 + 0.04 * 0.60 = 0.9456; after a
    # rejection at the text's 0.60.
    assert first.after_full == pytest.approx(0.9456, abs=0.005)
    assert first.after_rejection == pytest.approx(0.60, abs=0.01)
    assert first.at(4) == pytest.approx(at4[0])
    # Held fixed, a_0 at k = 8 would be off by the drop itself (~0.05); the mix tracks it.
    assert at4[0] - at8[0] > 0.04
    assert first.at(8) == pytest.approx(at8[0], abs=0.005)
    assert first.at(2) == pytest.approx(at2[0], abs=0.005)


def test_no_first_position_mix_where_it_cannot_be_told() -> None:
    assert dg.FirstPosition.fit([0.8], 1) is None  # no in-cycle rate at k = 1
    assert dg.FirstPosition.fit([0.9, 0.8, 0.8], 3) is None  # a_0 above the later rates
    assert dg.FirstPosition.fit([0.8, 0.9], 3) is None  # fewer rates than k
    # All or nothing after the first token (a mis-wired draft on a short window): the starts
    # after a rejection would be accepted at 0, and a_0 at another k is not defined.
    assert dg.FirstPosition.fit([0.5, 1.0, 1.0], 3) is None
    f = dg.advise_k(brk(positions=(0.5, 0.5, 0.5, 0.5)))
    assert f is not None and f.evidence["first_position_after_rejection"] is None


def test_the_advice_counts_the_first_positions_fall_at_a_longer_k() -> None:
    cond = markov_acceptance(4, 60_000, 1)
    positions = tuple(math.prod(cond[: i + 1]) for i in range(4))
    host = {"draft": 0.4e-3, "verify": 2e-3, "bookkeeping": 0.1e-3}
    f = dg.advise_k(brk(positions=positions, host=host), measured())
    assert f is not None
    first = dg.FirstPosition.fit(cond, 4)
    assert first is not None
    assert f.evidence["first_position_after_rejection"] == pytest.approx(first.after_rejection)
    cost7 = 0.1e-3 + 2e-3 + 0.4e-3 * (7 + th.DRAFT_FIXED_STEPS) / (4 + th.DRAFT_FIXED_STEPS)
    assert f.evidence["predicted_tokens_per_second_k7"] == pytest.approx(
        dg.expected_tokens([first.at(7), *cond[1:]], 7) / cost7, rel=1e-6)
    # Below the rate that held a_0 fixed would predict.
    assert f.evidence["predicted_tokens_per_second_k7"] < dg.expected_tokens(cond, 7) / cost7


def test_on_the_gpu_clock_the_drafts_fixed_part_is_the_hosts_draft_time() -> None:
    # The demo on a GPU (k = 4, benchmarks/RESULTS.md): the GPU waits through the host's 0.08 ms
    # of draft preparation, then runs 0.1685 ms of kernels a position. At k = 8 it measured
    # 1.436 ms; k + 1 steps would have said 1.357.
    host = {"draft": 0.080e-3, "verify": 0.060e-3, "bookkeeping": 1.636e-3}
    gpu = {"draft": 0.754e-3, "verify": 0.872e-3, "bookkeeping": 0.144e-3}
    b = brk(positions=(0.888, 0.854, 0.824, 0.802), host=host, gpu=gpu, gpu_cycles=1000)
    assert dg.draft_fixed(b, "gpu", 0.754e-3, 4) == (pytest.approx(0.080e-3), "host")
    f = dg.advise_k(b, measured())
    assert f is not None and f.evidence["draft_fixed_from"] == "host"
    # Costs are host seconds: the GPU phases laid onto the host cycle (here 1.0034 times them).
    scale = sum(host.values()) / sum(gpu.values())
    per = f.evidence["draft_per_position_seconds"]
    assert per == pytest.approx(scale * (0.754e-3 - 0.080e-3) / 4)
    assert scale * 0.080e-3 + 7 * per == pytest.approx(1.265e-3, abs=0.01e-3)
    rest = scale * (0.872e-3 + 0.144e-3)
    cond = [a for _, a in dg.conditional_acceptance(b)]
    first = dg.FirstPosition.fit(cond, 4)
    assert first is not None
    assert f.evidence["predicted_tokens_per_second_k7"] == pytest.approx(
        dg.expected_tokens([first.at(7), *cond[1:]], 7) / (rest + scale * 0.080e-3 + 7 * per))
    assert "grows by 0.169 ms a position over 0.080 ms" in f.advice
    # The host clock has nothing to split by: c steps of k + c. Nor has a host draft longer
    # than the GPU's (an engine whose host runs ahead of its GPU).
    assert dg.draft_fixed(b, "host", 0.080e-3, 4) == (
        pytest.approx(0.080e-3 * th.DRAFT_FIXED_STEPS / (4 + th.DRAFT_FIXED_STEPS)), "steps")
    ahead = brk(host={**host, "draft": 0.9e-3}, gpu=gpu, gpu_cycles=1000)
    assert dg.draft_fixed(ahead, "gpu", 0.754e-3, 4)[1] == "steps"


def test_no_advice_without_phase_costs() -> None:
    assert dg.advise_k(brk(cycles=0)) is None


# -- against the cohort ---------------------------------------------------------------------------


def test_a_server_against_its_cohort() -> None:
    peers = brk(cycles=3000, host=HEALTHY)
    same = dg.against_cohort(brk(cycles=300, host=HEALTHY), peers, 3, "m on vllm")
    assert codes(same) == ["SPEC-COHORT-MATCHES"] and same[0].severity == "ok"
    slow = {**HEALTHY, "verify": 2.5 * HEALTHY["verify"]}
    out = dg.against_cohort(brk(cycles=300, host=slow), peers, 3, "m on vllm")
    assert codes(out) == ["SPEC-COHORT-PHASE-SLOWER"]
    assert out[0].sentence.startswith("verify takes ") and "the other 3 servers of m on vllm" \
        in out[0].sentence and out[0].evidence["ratio"] == pytest.approx(2.5)
    # The same phase time at a batch 1.5x the cohort's is the batch, not the server.
    assert "SPEC-COHORT-PHASE-SLOWER" not in codes(
        dg.against_cohort(brk(cycles=300, host=slow, batch=6.0), peers, 3, "m on vllm"))
    low = dg.against_cohort(brk(cycles=300, positions=(0.4, 0.3, 0.2, 0.1)), peers, 3, "m",
                            drafted=(12000.0, 1200.0))
    assert codes(low) == ["SPEC-COHORT-ACCEPT-BELOW"] and low[0].severity == "warn"
    assert dg.against_cohort(brk(cycles=5), peers, 3, "m") == []
