"""The time between cycles and the sequences by draft length, end to end.

``specobs_cycle_gap_seconds`` observes the host seconds from the end of a cycle to the begin of
the next cycle the same thread recorded (idle gaps over ``idle_gap_seconds`` counted apart in
``specobs_cycle_idle_gaps_total``); ``specobs_sequences_by_draft_length_total`` sums the batch
sizes of the cycles of each k. Both are computed when cycles are resolved, from what the ring's
slots carry, on both rings (the native core and its pure-Python specification): checked here
against the cycles' own stamps, against sleeps between cycles (a lower bound, whatever the
load), across threads, across a lost cycle, through the Prometheus scrape path into the
breakdown, and through the settings' validation.
"""

from __future__ import annotations

import bisect
import io
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
from rich.console import Console

import specobs
from specobs import _ring, catalog
from specobs._recorder import NULL_CYCLE
from specobs.sinks.otlp import OtlpSink
from specobs.tools import _breakdown as bd
from specobs.tools import _scrape as scr
from specobs.tools import _top
from tests._cores import PHASES, K
from tests._otlp_receiver import OtlpReceiver, attributes_to_dict

BOUNDS = catalog.DURATION_BUCKETS_SECONDS
#: What the recording thread sleeps between cycles; no bucket bound lies between 5 ms and it.
SLEEP = 0.006


@pytest.fixture
def workers() -> Iterator[Callable[[int], list[ThreadPoolExecutor]]]:
    """Threads of their own, each running what it is handed, one call at a time: the test
    decides which thread records each cycle, and in what order."""
    made: list[ThreadPoolExecutor] = []

    def new(n: int) -> list[ThreadPoolExecutor]:
        pools = [ThreadPoolExecutor(max_workers=1) for _ in range(n)]
        made.extend(pools)
        return pools

    yield new
    for pool in made:
        pool.shutdown(wait=True)


def cycle(obs: Any, batch: Any = None, k: Any = None, accepted: Any = None,
          **accept_kw: Any) -> int:
    """One cycle through its three phases, begun with ``batch`` and draft length ``k``, and
    ``accept(accepted, **accept_kw)`` when given; returns its index."""
    c = obs.begin(batch, k)
    c.mark("verify")
    c.mark("bookkeeping")
    if accepted is not None:
        c.accept(accepted, **accept_kw)
    c.end()
    return int(c.index)


def bucketed(values_ns: list[int]) -> tuple[list[int], int]:
    """What the gap histogram holds for these gaps: counts per bucket (Prometheus "le", the
    duration bounds, +Inf last) and the sum in ns."""
    counts = [0] * (len(BOUNDS) + 1)
    for v in values_ns:
        counts[bisect.bisect_left(BOUNDS, v * 1e-9)] += 1
    return counts, sum(values_ns)


def thread_gaps(cycles: list[specobs.ResolvedCycle], thread_of: dict[int, int]) -> list[int]:
    """The gaps the definition gives, from each cycle's own stamps: begin minus the end of the
    previous cycle of the same thread, in ns."""
    last: dict[int, int] = {}
    gaps = []
    for rc in sorted(cycles, key=lambda r: r.index):
        t = thread_of[rc.index]
        if t in last:
            gaps.append(rc.start_wall_ns - last[t])
        last[t] = rc.end_wall_ns
    return gaps


def flushed(obs: specobs.Observer) -> specobs.Snapshot:
    assert obs.force_flush(5.0)
    return obs.snapshot()


# -- the catalog and the settings --------------------------------------------------------------


def test_the_catalog_names_translate_to_the_documented_prometheus_names() -> None:
    gap, idle, seqs = catalog.CYCLE_GAP, catalog.IDLE_GAPS, catalog.SEQUENCES_BY_DRAFT_LENGTH
    assert gap.series() == ("specobs_cycle_gap_seconds_bucket", "specobs_cycle_gap_seconds_sum",
                            "specobs_cycle_gap_seconds_count")
    assert (gap.kind, gap.unit, gap.labels, gap.buckets) == ("histogram", "s", (), BOUNDS)
    assert gap.buckets == catalog.CYCLE_DURATION.buckets
    assert (idle.name, idle.kind, idle.labels) == ("specobs_cycle_idle_gaps_total", "counter", ())
    assert (seqs.name, seqs.labels, seqs.optional) == (
        "specobs_sequences_by_draft_length_total", ("draft_length",), True)
    # Required: a real observer always exports them, zero before a second cycle.
    assert not gap.optional and not idle.optional


@pytest.mark.parametrize(("kwargs", "env", "message"), [
    ({"idle_gap_seconds": 0}, {}, "idle_gap_seconds must be in (0.0, 86400.0], got 0"),
    ({"idle_gap_seconds": -1.5}, {}, "idle_gap_seconds must be in (0.0, 86400.0], got -1.5"),
    ({"idle_gap_seconds": "soon"}, {}, "idle_gap_seconds must be a number, got 'soon'"),
    ({}, {"SPECOBS_IDLE_GAP_SECONDS": "1s"},
     "SPECOBS_IDLE_GAP_SECONDS must be a number, got '1s'"),
    ({}, {"SPECOBS_IDLE_GAP_SECONDS": "inf"},
     "SPECOBS_IDLE_GAP_SECONDS must be in (0.0, 86400.0], got 'inf'"),
])
def test_a_bad_idle_gap_bound_is_refused_with_what_was_expected_and_got(
    kwargs: dict[str, Any], env: dict[str, str], message: str
) -> None:
    with pytest.raises(specobs.ConfigurationError) as err:
        specobs.configure(sinks=[], clock="host", env=env, **kwargs)
    assert str(err.value) == message


def test_the_idle_gap_bound_reaches_the_ring_from_the_variable_and_the_argument(
    core: str, observers: Callable[..., specobs.Observer]
) -> None:
    assert specobs.Settings().idle_gap_seconds == 1.0
    obs = observers(env={"SPECOBS_IDLE_GAP_SECONDS": "0.25"})
    assert obs.settings.idle_gap_seconds == 0.25
    assert obs._recorder.ring.idle_gap_ns == 250_000_000
    obs = observers(env={"SPECOBS_IDLE_GAP_SECONDS": "0.25"}, idle_gap_seconds=2)
    assert obs._recorder.ring.idle_gap_ns == 2_000_000_000


# -- the gaps, through the public API ----------------------------------------------------------


def test_every_gap_is_at_least_the_sleep_between_cycles(
    core: str, observers: Callable[..., specobs.Observer]
) -> None:
    obs = observers()
    n = 24  # more than the native core's walk without the GIL needs to start (16)
    for i in range(n):
        k = i % 3
        cycle(obs, 4, k, [min(v, k) for v in (1, 0, 2, 1)], draft_length=k)
        time.sleep(SLEEP)
    s = flushed(obs)
    gap = s.cycle_gap
    assert gap is not None and gap.bounds == BOUNDS
    assert gap.count == n - 1 and s.idle_gaps_total == 0
    # No gap below the sleep: nothing in any bucket at or under 5 ms, and the sum at least n - 1
    # sleeps (the cycles' own time is not in it: that is the other test's exact check).
    below = bisect.bisect_left(BOUNDS, 0.005) + 1
    assert sum(gap.counts[:below]) == 0
    assert gap.sum >= (n - 1) * SLEEP


def test_gaps_are_the_stamps_of_each_threads_own_cycles(
    core: str, observers: Callable[..., specobs.Observer],
    workers: Callable[[int], list[ThreadPoolExecutor]],
) -> None:
    """Two threads take turns on one observer (never inside each other's cycle): each thread's
    gap runs from its own previous cycle, across the other's, so there are cycles - 1 gaps per
    thread and each is what the cycles' own stamps say, to the nanosecond."""
    mem = specobs.MemorySink()
    obs = observers(sinks=[mem])
    pools = workers(2)
    rng = random.Random(7)
    thread_of: dict[int, int] = {}
    per_thread = [0, 0]
    for _ in range(30):
        t = rng.randrange(2)
        thread_of[pools[t].submit(cycle, obs, 2, 1, [1, 0], draft_length=1).result()] = t
        per_thread[t] += 1
        time.sleep(rng.choice([0.0, 0.001, 0.003]))
    s = flushed(obs)
    assert len(mem.cycles) == 30 and min(per_thread) > 1
    expected = thread_gaps(mem.cycles, thread_of)
    assert len(expected) == sum(n - 1 for n in per_thread) == 28
    counts, total_ns = bucketed(expected)
    assert s.cycle_gap is not None
    assert list(s.cycle_gap.counts) == counts
    assert s.cycle_gap.sum == pytest.approx(total_ns * 1e-9, rel=1e-12)
    # Gaps taken between the ring's consecutive cycles instead would differ wherever the threads
    # alternate (here some do): the thread is what the gap follows.
    ring_gaps = [b.start_wall_ns - a.end_wall_ns
                 for a, b in zip(mem.cycles, mem.cycles[1:], strict=False)]
    assert bucketed(ring_gaps) != (counts, total_ns)


def test_two_threads_sleeping_between_their_cycles_each_have_cycles_minus_one_gaps(
    core: str, observers: Callable[..., specobs.Observer],
    workers: Callable[[int], list[ThreadPoolExecutor]],
) -> None:
    obs = observers()  # no sink that wants every cycle: the native core walks them in C
    pools = workers(2)
    n = 12
    for _ in range(n):
        for pool in pools:
            pool.submit(cycle, obs, 3, 2, [2, 1, 0], draft_length=2).result()
        time.sleep(SLEEP)
    s = flushed(obs)
    assert s.cycles_total == 2 * n
    assert s.cycle_gap is not None and s.cycle_gap.count == 2 * (n - 1)
    below = bisect.bisect_left(BOUNDS, 0.005) + 1
    assert sum(s.cycle_gap.counts[:below]) == 0  # every gap holds a sleep
    assert s.idle_gaps_total == 0


def test_a_gap_over_the_idle_bound_is_counted_as_idle_and_left_out_of_the_histogram(
    core: str, observers: Callable[..., specobs.Observer]
) -> None:
    obs = observers(env={"SPECOBS_IDLE_GAP_SECONDS": "0.5"})
    for _ in range(3):
        cycle(obs)
    time.sleep(0.6)  # the engine idles
    for _ in range(3):
        cycle(obs)
    s = flushed(obs)
    assert s.cycles_total == 6
    assert s.idle_gaps_total == 1
    assert s.cycle_gap is not None and s.cycle_gap.count == 4
    # Nothing observed above the bound: the idle gap is not in the histogram.
    assert s.cycle_gap.cumulative()[BOUNDS.index(0.5)][1] == 4


def test_no_gap_spans_a_cycle_that_was_lost(
    core: str, observers: Callable[..., specobs.Observer]
) -> None:
    """A cycle the engine raised in is discarded, never resolved: the gap across it would hold
    that cycle's own time, so the next cycle has none."""
    mem = specobs.MemorySink()
    obs = observers(sinks=[mem])
    cycle(obs)
    cycle(obs)
    with pytest.raises(RuntimeError), obs.cycle() as c:
        c.mark("verify")
        raise RuntimeError("the engine failed mid-cycle")
    cycle(obs)
    cycle(obs)
    s = flushed(obs)
    assert s.cycles_total == 4 and s.dropped["exception"] == 1
    # 0 -> 1 and 3 -> 4 only (index 2 was the lost one).
    assert [rc.index for rc in mem.cycles] == [0, 1, 3, 4]
    kept = [mem.cycles[1].start_wall_ns - mem.cycles[0].end_wall_ns,
            mem.cycles[3].start_wall_ns - mem.cycles[2].end_wall_ns]
    assert s.cycle_gap is not None
    assert s.cycle_gap.count == 2 and s.idle_gaps_total == 0
    assert s.cycle_gap.sum == pytest.approx(sum(kept) * 1e-9, rel=1e-12)


# -- the rings, side by side -------------------------------------------------------------------


def _ring_pair(idle_gap_ns: int) -> list[Any]:
    rings = []
    for cls in ([_ring.NativeRing] if _ring.BUILT else []) + [_ring.PyRing]:
        ring = cls(_Quiet(), PHASES, 1024, K, 16, BOUNDS, catalog.BATCH_SIZE_BUCKETS, NULL_CYCLE)
        ring.tick = 997  # ns per clock read: every gap is known exactly
        ring.idle_gap_ns = idle_gap_ns
        rings.append(ring)
    return rings


class _Quiet:
    """The recorder's side of a ring that sees only well-formed cycles (and counts misuse)."""

    def __init__(self) -> None:
        self.misused = 0

    def misuse(self, kind: str, message: Any) -> None:
        self.misused += 1

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


def test_both_rings_give_each_thread_its_own_gaps_and_the_same_totals(
    workers: Callable[[int], list[ThreadPoolExecutor]],
) -> None:
    """Three threads in a random order, with cycles discarded on the way, on the native ring
    and its specification with one counting clock: the gaps are what the stamps give, per
    thread, those over the idle bound counted apart, none across a discarded cycle; and both
    rings' drains and running totals are the same."""
    pools = workers(3)
    outs = []
    for ring in _ring_pair(idle_gap_ns=6 * 997):
        rng = random.Random(11)
        thread_of: dict[int, int] = {}
        details: list[Any] = []
        for step in range(120):
            t = rng.randrange(3)
            if step % 37 == 36:  # a cycle discarded: begun, never ended, then begun over
                pools[t].submit(ring.begin).result()
            thread_of[pools[t].submit(cycle, ring, 2, t).result()] = t
            if step == 60:  # half way: into the running totals, as the resolver drains
                details += ring.drain_into(1 << 60, 1 << 30, [], -1, True)[2]
        # The rest in one chunk of its own (the gaps remembered across the two).
        out = _ring.Drained._make(ring.drain(1 << 60, 1 << 30, [], -1, True))
        details += out.details
        totals = _ring.RingTotals._make(ring.totals())
        gap = ([a + b for a, b in zip(totals.gap[0], out.gap[0], strict=True)],
               totals.gap[1] + out.gap[1])
        gaps: list[int] = []
        last: dict[int, int] = {}
        prev = -1
        for d in details:
            if d.cycle_index != prev + 1:
                last.clear()  # a discarded cycle lies in between
            prev = d.cycle_index
            th = thread_of[d.cycle_index]
            if th in last:
                gaps.append(d.stamps[0] - last[th])
            last[th] = d.stamps[-1]
        observed = [g for g in gaps if g <= 6 * 997]
        assert len(details) == 120 and totals.cycles == 61  # the 3 discarded are not cycles
        assert gap == bucketed(observed)
        assert totals.idle_gaps + out.idle_gaps == len(gaps) - len(observed) > 0
        assert len(observed) > 20 and len({*observed}) > 1  # consecutive and interleaved gaps
        outs.append((out.gap, out.idle_gaps, totals.gap, totals.idle_gaps))
    assert all(o == outs[0] for o in outs)


def test_a_thread_beyond_those_remembered_takes_the_place_of_the_least_recent(
    workers: Callable[[int], list[ThreadPoolExecutor]],
) -> None:
    n = _ring.GAP_THREADS + 1
    pools = workers(n)
    outs = []
    for ring in _ring_pair(idle_gap_ns=1 << 60):
        for pool in pools:  # thread 0 first: the least recent once all have recorded
            pool.submit(cycle, ring).result()
        pools[0].submit(cycle, ring).result()  # forgotten: no gap
        pools[2].submit(cycle, ring).result()  # remembered: a gap
        out = _ring.Drained._make(ring.drain(1 << 60, 1 << 30, [], -1, False))
        outs.append((out.gap, out.idle_gaps))
        # The only gap is thread 2's: from the end of the third cycle (index 2) to the begin of
        # the cycle of index n + 1, four clock reads a cycle, 997 ns a read.
        assert out.gap == bucketed([((4 * (n + 1) + 1) - (4 * 2 + 4)) * 997])
        assert out.idle_gaps == 0
    assert all(o == outs[0] for o in outs)


# -- sequences by draft length -----------------------------------------------------------------


def test_sequences_by_draft_length_sum_the_batch_sizes_of_each_k(
    core: str, observers: Callable[..., specobs.Observer]
) -> None:
    """Every way a cycle gets its k and its batch size: taken by the ring, or validated by the
    resolver (a numpy batch size or k, acceptance kept as an object)."""
    obs = observers()
    cycle(obs, 4, 2, [1, 0, 2, 2], draft_length=2)  # the ring: batch 4 at k 2
    cycle(obs, 3, 0)  # a plain step of 3 sequences, no acceptance
    cycle(obs, np.int64(5), 3, [3, 1, 0, 0, 2], draft_length=3)  # the resolver's batch size
    cycle(obs, None, np.int64(1), [1, 1], draft_length=1)  # the resolver's k, 2 sequences
    cycle(obs, 6, None, [1, 2, 0], draft_length=[2, 2, 1])  # k 2 from acceptance kept whole
    cycle(obs, None, None, [0, 1], draft_length=1)  # k 1 and 2 sequences from accept()
    cycle(obs, None, 2)  # k 2 and no batch size: a cycle, no sequences
    cycle(obs, 7)  # a batch without a k: in no series by k
    s = flushed(obs)
    assert s.cycles_by_draft_length == {0: 1, 1: 2, 2: 3, 3: 1}
    assert s.batch_by_draft_length == {0: 3, 1: 4, 2: 10, 3: 5}
    assert s.batch_size.sum == 3 + 4 + 10 + 5 + 7  # each sequence counted once
    fams = {f.metric: f for f in specobs_families(s)}
    assert fams[catalog.SEQUENCES_BY_DRAFT_LENGTH].points == [
        (("0",), 3), (("1",), 4), (("2",), 10), (("3",), 5)]


def test_the_otlp_sink_exports_the_gaps_and_the_sequences_by_k(
    core: str, observers: Callable[..., specobs.Observer], otlp_receiver: OtlpReceiver
) -> None:
    sink = OtlpSink(endpoint=otlp_receiver.http_endpoint, protocol="http/protobuf",
                    export_interval_seconds=3600.0)
    obs = observers(sinks=[sink], idle_gap_seconds=0.3)
    cycle(obs, 3, 1, [1, 0, 1], draft_length=1)
    cycle(obs, 5, 2, [2, 2, 1, 0, 0], draft_length=2)
    time.sleep(0.4)
    cycle(obs, 2, 2, [0, 0], draft_length=2)
    s = flushed(obs)
    received = {metric.name: metric for _, metric in otlp_receiver.metrics()}
    gap = received["specobs.cycle.gap"]
    assert gap.unit == "s"
    (point,) = gap.histogram.data_points
    assert tuple(point.explicit_bounds) == BOUNDS
    assert s.cycle_gap is not None
    assert point.count == s.cycle_gap.count == 1
    assert list(point.bucket_counts) == list(s.cycle_gap.counts)
    assert point.sum == pytest.approx(s.cycle_gap.sum)
    (idle,) = received["specobs.cycle.idle_gaps"].sum.data_points
    assert idle.as_int == 1 and received["specobs.cycle.idle_gaps"].sum.is_monotonic
    seqs = received["specobs.sequences_by_draft_length"]
    assert seqs.unit == "{sequence}" and seqs.sum.is_monotonic
    assert {attributes_to_dict(p.attributes)["draft_length"]: p.as_int
            for p in seqs.sum.data_points} == {"1": 3, "2": 7}


def specobs_families(s: specobs.Snapshot) -> list[Any]:
    from specobs._series import families

    return list(families(s))


# -- the breakdown, from a real exposition -----------------------------------------------------


def test_the_breakdown_reads_gaps_and_stats_by_k_from_two_scrapes(
    core: str, observers: Callable[..., specobs.Observer]
) -> None:
    mem = specobs.MemorySink()
    sink = specobs.PrometheusSink(port=0, addr="127.0.0.1")
    obs = observers(sinks=[mem, sink])  # the default idle bound, 1 s
    url = f"http://127.0.0.1:{sink.port}/metrics"
    cycle(obs, 2, 1, [1, 0], draft_length=1)
    assert obs.force_flush(5.0)
    with httpx.Client(timeout=5) as client:
        first = scr.scrape(client, url)
        plan = [(1, 2), (3, 4), (3, 6), (0, 8), (1, 2), (3, 4)]
        for i, (k, batch) in enumerate(plan):
            time.sleep(1.1 if i == 3 else 0.002)  # the fourth follows an idle gap
            cycle(obs, batch, k, [min(1, k)] * batch, draft_length=k)
        assert obs.force_flush(5.0)
        second = scr.scrape(client, url)
    delta = scr.difference(first, second)
    assert isinstance(delta, scr.Delta)
    b = bd.breakdown(delta)

    window = mem.cycles[1:]
    gaps = [c.start_wall_ns - p.end_wall_ns for p, c in zip(mem.cycles, window, strict=False)]
    observed = [g for g in gaps if g <= 1_000_000_000]
    idle = len(gaps) - len(observed)
    assert idle >= 1  # the long sleep (the first gap holds a scrape too: idle only if slow)
    assert b.gap_count == len(observed) and b.idle_gaps == idle
    assert b.gap_mean_seconds == pytest.approx(sum(observed) * 1e-9 / len(observed), rel=1e-6)
    cumulative = dict(zip((*BOUNDS, float("inf")),
                          np.cumsum(bucketed(observed)[0]).tolist(), strict=True))
    assert b.gap_median_seconds == pytest.approx(bd.histogram_quantile(0.5, cumulative))
    host = sum(c.host_cycle_ns for c in window)
    assert b.gap_share == pytest.approx(sum(observed) / (sum(observed) + host), rel=1e-6)

    assert [ks.k for ks in b.by_draft_length] == [0, 1, 3]
    by_k = {ks.k: ks for ks in b.by_draft_length}
    assert (by_k[0].cycles, by_k[1].cycles, by_k[3].cycles) == (1, 2, 3)
    assert (by_k[0].sequences, by_k[1].sequences, by_k[3].sequences) == (8, 4, 14)
    assert by_k[3].mean_batch == pytest.approx(14 / 3)
    # Two cycles of 2 sequences at k = 1, each sequence accepting its one draft.
    assert (by_k[1].emitted, by_k[1].accepted, by_k[1].drafted) == (8, 4, 4)
    for k, ks in by_k.items():
        mine = [c for c, (kk, _) in zip(window, plan, strict=True) if kk == k]
        for i, phase in enumerate(PHASES):
            assert ks.phase_seconds[phase] == pytest.approx(
                sum(c.host_ns[i] for c in mine) * 1e-9, rel=1e-6)
            assert ks.phase_mean_seconds(phase) == pytest.approx(
                sum(c.host_ns[i] for c in mine) * 1e-9 / len(mine), rel=1e-6)
    assert by_k[0].phase_mean_seconds("nope") is None
    # The JSON top and report print carries them; top's views show the time between cycles.
    assert b.as_json()["by_draft_length"][2]["mean_batch"] == pytest.approx(14 / 3)
    frame = _top._data_frame(b)
    assert (f"between={scr.format_seconds(b.gap_mean_seconds, True)}"
            f"({scr.format_percent(b.gap_share)})") in _top.plain_line(frame)
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(_top.LiveView("x", 1.0, console).render(frame, None))
    row = next(line for line in console.export_text().splitlines() if "between cycles" in line)
    assert scr.format_percent(b.gap_share) in row
    assert scr.format_seconds(b.gap_median_seconds) in row


def test_a_breakdown_of_an_endpoint_without_the_new_series_reads_none_not_zero() -> None:
    """An older endpoint: no gap histogram, no sequences by k."""
    series = scr.Series()
    series.add(catalog.CYCLES.name, {}, 10.0)
    series.add(catalog.CYCLES_BY_DRAFT_LENGTH.name, {"draft_length": "2"}, 10.0)
    b = bd.breakdown(scr.Delta(series, scr.Series(), 1.0))
    assert (b.gap_count, b.gap_mean_seconds, b.gap_median_seconds, b.gap_share) == (
        0.0, None, None, None)
    (ks,) = b.by_draft_length
    assert (ks.k, ks.cycles, ks.sequences, ks.mean_batch, ks.phase_seconds) == (
        2, 10.0, None, None, {})
