"""Sampled cycles' GPU times read by the ring itself (``Ring.set_native_events``): the resolver
hands it the runtime's ``cudaEventElapsedTime`` once the clock's direct path is checked on its
thread, and the drain reads the times of every sampled cycle that needs Python for nothing else
-- in the native core with the GIL let go. Driven here by a fake runtime written in C
(``FakeNativeEventClock``), on both rings (scripts/check runs this file with
``SPECOBS_CORE=python`` too)."""

from __future__ import annotations

import time

import pytest

import specobs
from specobs import _ring
from specobs.timing._base import EventPool
from specobs.timing.fake import FakeGpu, FakeNativeEvent, FakeNativeEventClock


def run(native: bool, n: int = 2000, *, sinks: list[object] | None = None,
        slow: float | None = None, pool: int = 4096, spoil: int = -1,
        ) -> tuple[specobs.Snapshot, object, FakeNativeEventClock]:
    """``n`` cycles, one in two GPU-timed, drained by the resolver thread as they complete.
    Cycle ``i``'s draft and verify take 1000 + i % 7 and 2500 + 3 * (i % 5) ns of fake GPU
    time; every 97th cycle's verify takes 2 ms (slow). ``spoil``: this many of the pool's events
    get an unusable handle (0), so the cycles that draw them are read in Python."""
    gpu = FakeGpu()
    clock = FakeNativeEventClock(gpu, pool_size=pool, native=native)
    for ev in clock._free[:max(spoil, 0)]:
        ev.cuda_event = 0
    obs = specobs.configure(sinks=sinks or [], clock=clock, sample_every=2,
                            poll_interval_seconds=0.002, max_draft_length=4,
                            trace_slow_cycle_seconds=slow, trace_head_rate=0.0)
    try:
        for i in range(n):
            with obs.cycle(batch_size=4) as c:
                gpu.run(1000 + i % 7)
                c.mark("verify")
                gpu.run(2_000_000 if i % 97 == 0 else 2500 + 3 * (i % 5))
                c.mark("bookkeeping")
                gpu.run(300)
                c.accept([1, 2, 0, 3], draft_length=4)
            if i % 40 == 39:
                gpu.complete()
                time.sleep(0.002)  # the resolver drains what completed, as the worker goes on
        gpu.complete()
        assert obs.force_flush(30)
        return obs.snapshot(), obs._recorder.ring, clock
    finally:
        obs.shutdown(5)


def plain_cycles(obs: specobs.Observer, gpu: FakeGpu, n: int) -> None:
    """``n`` cycles of 1,000 ns of draft and 2,000 ns of verify on the fake GPU, no acceptance."""
    for _ in range(n):
        with obs.cycle() as c:
            gpu.run(1000)
            c.mark("verify")
            gpu.run(2000)
            c.mark("bookkeeping")


def gpu_figures(s: specobs.Snapshot) -> list[tuple[tuple[int, ...], float]]:
    hs = [s.phase_histograms[(p, "gpu")] for p in s.phases] + [s.cycle_histograms["gpu"]]
    return [(tuple(h.counts), h.sum) for h in hs]


def test_the_ring_reads_sampled_cycles_as_python_does() -> None:
    """Every sampled cycle read by the ring, and the same histograms as when the resolver reads
    them in Python (the runtime's float milliseconds rounded to integer ns on both)."""
    a, ring, clock = run(True)
    b, ring_py, _ = run(False)
    assert a.sampled_cycles_total == b.sampled_cycles_total == 1000
    assert ring.native_gpu_cycles == 1000  # type: ignore[attr-defined]
    assert ring_py.native_gpu_cycles == 0  # type: ignore[attr-defined]
    for (ca, sa), (cb, sb) in zip(gpu_figures(a), gpu_figures(b), strict=True):
        assert ca == cb
        assert sa == pytest.approx(sb, rel=1e-12)
    # The fake GPU's times: 1000 + i % 7 ns of draft on the even cycles.
    draft = a.phase_histograms[("draft", "gpu")]
    assert draft.sum == pytest.approx(sum(1000 + i % 7 for i in range(0, 2000, 2)) / 1e9)
    assert a.cycles_total == 2000 and a.accepted_tokens_total == 6 * 2000
    # The events went back to the clock's pool: none lost, none dropped.
    assert clock.free_events() == 4096
    assert a.dropped_total() == 0
    if _ring.NATIVE:
        # The sampled cycles no longer stop the walk without the GIL.
        assert ring.nogil_cycles > 1000  # type: ignore[attr-defined]


def test_events_are_back_in_a_small_pool_so_sampling_goes_on() -> None:
    """A pool of 40 events holds 13 sampled cycles (3 events each): were the events the ring
    read never handed back, every later sampled cycle would find the pool empty."""
    s, ring, clock = run(True, pool=40)
    assert s.sampled_cycles_total + s.dropped.get("event_pool_exhausted", 0) == 1000
    assert s.sampled_cycles_total > 100
    assert ring.native_gpu_cycles == s.sampled_cycles_total  # type: ignore[attr-defined]
    assert clock.free_events() == 40


def test_a_cycle_slow_by_gpu_time_is_still_traced() -> None:
    """Slow by its GPU time (2 ms of verify on every 97th cycle, the threshold 1 ms): such a
    cycle is handed to Python and traced with its GPU times; no other sampled cycle is (a cycle
    that is not sampled is slow by its host time, which this machine decides)."""
    sink = specobs.MemorySink(max_cycles=1 << 16, traces=True)
    sink.wants_cycles = False  # traces only: the rest is aggregated, never handed over
    s, ring, _ = run(True, sinks=[sink], slow=0.001)
    timed = [r for r in sink.cycles if r.trace_id is not None and r.gpu_ns is not None]
    # Cycles 0, 194, 388, ...: the even multiples of 97 are the sampled slow ones.
    want = [i for i in range(0, 2000, 2) if i % 97 == 0]
    assert sorted(r.index for r in timed) == want
    assert all(r.gpu_ns[1] == 2_000_000 for r in timed)  # type: ignore[index]
    assert all(r.index % 2 == 1 for r in sink.cycles if r.gpu_ns is None)
    assert ring.native_gpu_cycles == 1000 - len(want)  # type: ignore[attr-defined]
    assert s.sampled_cycles_total == 1000


def test_events_without_a_usable_handle_are_read_in_python() -> None:
    """Events whose handle is unusable (0) are left to the resolver, which reads them through
    the clock: every sampled cycle is still timed, with the same figures."""
    a, ring, _ = run(True, spoil=4096 - 30)
    b, _, _ = run(False)
    assert a.sampled_cycles_total == 1000
    assert 0 < ring.native_gpu_cycles < 1000  # type: ignore[attr-defined]
    for (ca, sa), (cb, sb) in zip(gpu_figures(a), gpu_figures(b), strict=True):
        assert ca == cb
        assert sa == pytest.approx(sb, rel=1e-12)


def test_only_the_thread_set_up_reads_natively() -> None:
    """The runtime's functions are called on the resolver's thread only (its current device
    is the clock's): a drain on another thread reads in Python."""
    gpu = FakeGpu()
    clock = FakeNativeEventClock(gpu, pool_size=256)
    obs = specobs.configure(sinks=[], clock=clock, sample_every=1,
                            poll_interval_seconds=3600, max_draft_length=4)

    def cycles(n: int) -> None:
        plain_cycles(obs, gpu, n)
        gpu.complete()

    try:
        ring = obs._recorder.ring
        cycles(20)
        assert obs.force_flush(10)  # the resolver's thread drains, and sets the ring up
        assert ring.native_gpu_cycles == 20
        res = obs._resolver
        res._stop.set()  # the resolver's thread ends: only this one drains from here on
        res.wake()
        res._thread.join(10)
        cycles(30)
        for _ in range(100):  # on this thread
            obs._resolver.drain()
            if obs.snapshot().cycles_total == 50:
                break
        s = obs.snapshot()
        assert s.sampled_cycles_total == 50
        assert ring.native_gpu_cycles == 20
        assert s.phase_histograms[("verify", "gpu")].sum == pytest.approx(50 * 2000 / 1e9)
    finally:
        obs.shutdown(5)


def test_the_poll_asks_events_without_python_and_pending_ones_wait() -> None:
    """The native core's poll asks sampled cycles' events through the runtime's query
    (``set_native_events``), not the clock's Python ``query``: cycles whose events have not
    completed still wait, and are drained once they have."""
    gpu = FakeGpu()
    clock = FakeNativeEventClock(gpu, pool_size=512)
    asked = [0]
    python_query = clock.query

    def counting(event: object) -> bool:
        asked[0] += 1
        return python_query(event)

    clock.query = counting  # type: ignore[method-assign]
    obs = specobs.configure(sinks=[], clock=clock, sample_every=1,
                            poll_interval_seconds=3600, max_draft_length=4)

    def cycles(n: int) -> int:
        plain_cycles(obs, gpu, n)
        return gpu.now_ns

    try:
        cycles(10)
        gpu.complete()
        assert obs.force_flush(10)  # the resolver's thread drains, and sets the ring up
        before = asked[0]
        half = cycles(10)
        cycles(10)
        gpu.complete_until(half)  # the GPU is partway: the last 10 cycles are in flight
        for _ in range(3):
            obs._resolver.wake()
            assert not obs.force_flush(0.3)
        assert obs.snapshot().cycles_total == 20
        gpu.complete()
        assert obs.force_flush(10)
        s = obs.snapshot()
        assert s.cycles_total == 30 and s.sampled_cycles_total == 30
        if type(obs._recorder.ring).__module__ == "specobs._core":
            assert asked[0] == before  # every question after set-up asked natively
    finally:
        obs.shutdown(5)


class _CountingEvent(FakeNativeEvent):
    """A fake event that counts reads of its handle."""

    __slots__ = ("_h",)
    reads = 0

    @property  # type: ignore[override]
    def cuda_event(self) -> int:
        _CountingEvent.reads += 1
        return self._h

    @cuda_event.setter
    def cuda_event(self, v: int) -> None:
        self._h = v


def test_each_events_handle_is_read_once() -> None:
    """The native core keeps each event object's handle (the clock's pool is fixed): 300
    sampled cycles drawing on a pool of 64 events read at most 64 handles, not 900."""
    gpu = FakeGpu()
    clock = FakeNativeEventClock(gpu, pool_size=64)
    EventPool.__init__(clock, [_CountingEvent(gpu) for _ in range(64)])
    _CountingEvent.reads = 0
    obs = specobs.configure(sinks=[], clock=clock, sample_every=1,
                            poll_interval_seconds=0.002, max_draft_length=4)
    try:
        for _ in range(30):
            plain_cycles(obs, gpu, 10)
            gpu.complete()
            assert obs.force_flush(10)
        s = obs.snapshot()
        assert s.cycles_total == 300
        assert s.sampled_cycles_total + s.dropped.get("event_pool_exhausted", 0) == 300
        ring = obs._recorder.ring
        assert ring.native_gpu_cycles == s.sampled_cycles_total
        if type(ring).__module__ == "specobs._core":
            assert 0 < _CountingEvent.reads <= 64
        else:
            assert _CountingEvent.reads >= 3 * s.sampled_cycles_total  # read at each drain
    finally:
        obs.shutdown(5)
