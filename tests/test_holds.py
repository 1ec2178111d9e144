"""The resolver's slicing policy and the hold meter benchmarks attach (specobs/_holds.py).

Driven with a fake thread clock and a stand-in for the ring's walk counters: no threads."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from specobs import _holds
from specobs._holds import DEFAULT_TUNING, HoldMeter, NullMeter, Tuning, next_chunk


@pytest.fixture
def thread_clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``time.thread_time_ns`` as a number the test moves."""
    now = [0]
    monkeypatch.setattr(_holds.time, "thread_time_ns", lambda: now[0])
    return now


def ring(walks: int = 0, out: int = 0, back: int = 0, hold: int = 0) -> SimpleNamespace:
    """The ring's counters of its last walk without the GIL: thread CPU at its start and end,
    its longest stretch under the GIL, and how many walks there were."""
    return SimpleNamespace(walk_count=walks, walk_cpu_out=out, walk_cpu_in=back,
                           walk_hold_ns=hold)


@pytest.mark.parametrize(("limit", "taken", "cpu_us", "expected"), [
    (64, 64, 100, 128),    # a full slice well under the 1 ms target: twice as many next
    (64, 64, 600, 64),     # full, but not well under it: as it was
    (64, 10, 100, 64),     # not full (nothing more to take): as it was
    (2048, 2048, 10, 2048),  # at the largest already
    (256, 256, 4000, 64),  # four times over: a quarter of what it took
    (256, 200, 40000, 16),  # far over: never under the smallest
    (16, 16, 4000, 16),    # over, but already at the smallest
])
def test_the_next_slice_is_sized_by_time(limit: int, taken: int, cpu_us: int, expected: int):
    assert next_chunk(limit, taken, cpu_us * 1000, 1_000_000) == expected


def test_production_runs_the_shipped_knobs_and_a_tuning_is_immutable():
    assert DEFAULT_TUNING == Tuning(_holds.SLICE_NS, _holds.YIELD_SECONDS, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_TUNING.slice_ns = 1  # type: ignore[misc]
    assert Tuning(use_pump=False).slice_ns == _holds.SLICE_NS


def test_a_meter_keeps_the_longest_hold_and_counts_the_long_ones():
    m = HoldMeter()
    for hold in (50_000, 150_000, 100_000, 100_001, 20_000):
        m.note(hold)
    assert m.max_hold_ns == 150_000
    assert m.long_holds == 2  # over 100 µs, not at it
    assert list(m.holds) == [50_000, 150_000, 100_000, 100_001, 20_000]


def test_a_hold_runs_from_taking_the_gil_back_to_letting_go(thread_clock: list[int]):
    m = HoldMeter()
    m.release_point()  # nothing taken back yet: no hold
    assert not m.holds
    thread_clock[0] = 1_000
    m.took_back()
    thread_clock[0] = 31_000
    m.release_point()
    m.release_point()  # let go already: not counted twice
    assert list(m.holds) == [30_000] and m.held_since is None
    m.took_back(at=40_000)  # the pump's figure, not the clock's
    thread_clock[0] = 45_000
    m.release_point()
    assert list(m.holds) == [30_000, 5_000]


def test_a_slice_on_the_resolvers_thread_without_a_walk_goes_on_to_the_next_release():
    m = HoldMeter()
    m.took_back(at=1_000)
    m.slice_done(ring(), t_cpu=2_000, t_end=9_000, cpu=7_000, in_run=True)
    assert not m.holds and m.held_since == 1_000 and m.slices == 1


def test_a_walk_splits_the_resolvers_hold_at_its_start_and_end():
    m = HoldMeter()
    m.took_back(at=1_000)
    walk = ring(walks=1, out=4_000, back=60_000, hold=2_500)
    m.slice_done(walk, t_cpu=2_000, t_end=70_000, cpu=13_000, in_run=True)
    # From taking the GIL back to the walk's start; the walk's own stretch under the GIL; the
    # rest runs on from the walk's end.
    assert list(m.holds) == [3_000, 2_500]
    assert m.held_since == 60_000


def test_a_walk_before_this_slice_does_not_split_it():
    m = HoldMeter()
    m.slice_done(ring(walks=3, out=500, back=900, hold=100), t_cpu=2_000, t_end=9_000,
                 cpu=7_000, in_run=True)
    assert not m.holds and m.held_since == 2_000  # the slice's start: nothing known earlier


def test_another_threads_slice_is_its_own_longest_stretch():
    m = HoldMeter()
    m.slice_done(ring(), t_cpu=0, t_end=9_000, cpu=7_000, in_run=False)
    walk = ring(walks=1, out=3_000, back=20_000, hold=4_000)
    m.slice_done(walk, t_cpu=1_000, t_end=26_000, cpu=8_000, in_run=False)
    assert list(m.holds) == [7_000, 6_000]  # after the walk: 26 - 20 µs, the longest
    assert m.held_since is None  # another thread's slice leaves the resolver's alone


def test_pump_returns_are_counted_by_reason_and_reset_clears_everything():
    m = HoldMeter()
    for why in ("python", "wake", "python"):
        m.pump_returned(why)
    m.note(200_000)
    m.took_back(at=5)
    assert m.pump_returns == {"python": 2, "wake": 1}
    m.reset()
    assert (m.pump_returns, list(m.holds), m.max_hold_ns, m.long_holds, m.slices,
            m.held_since) == ({}, [], 0, 0, 0, None)


def test_the_null_meter_records_nothing(thread_clock: list[int]):
    m = NullMeter()
    m.took_back()
    thread_clock[0] = 500_000
    m.release_point()
    m.note(300_000)
    m.pump_returned("python")
    m.slice_done(ring(walks=1, out=1, back=2, hold=3), t_cpu=0, t_end=9, cpu=9, in_run=False)
    assert (list(m.holds), m.max_hold_ns, m.slices, m.pump_returns) == ([], 0, 0, {})
