"""CUDA acceptance copies started by the native core itself (``Ring.set_native_copy``), on a
fake runtime: the same slots, calls and counts as the clock's ``copy_to_host``, without it.

``FakeNativeCopyClock`` hands the core C functions in the place of ``cudaMemcpyAsync``,
``cudaEventRecord`` and ``cudaGetLastError`` (``ctypes`` callbacks on a fake timeline), so every
branch the GPU takes runs here: the copy, its event, a refused copy (the Python path copies
instead), a refused event (recorded through the clock), and every tensor the core leaves to the
Python path. Under ``SPECOBS_CORE=python`` the ring has no native copy: the same cycles go
through ``copy_to_host`` and the same totals come out."""

from __future__ import annotations

import time
from typing import Any

import pytest

import specobs
from specobs._holds import Tuning
from specobs.timing import FakeDeviceArray, FakeGpu, FakeNativeCopyClock


def cycles(obs: specobs.Observer, gpu: FakeGpu, accs: list[Any]) -> Any:
    """One cycle per acceptance in ``accs``, all flushed; the snapshot after them."""
    for i, acc in enumerate(accs):
        c = obs.begin(batch_size=len(acc.values) if isinstance(acc, FakeDeviceArray) else None)
        gpu.run(10 + i)
        c.mark("verify")
        c.accept(acc, draft_length=4)
        gpu.run(5)
        c.mark("bookkeeping")
        gpu.run(3)
        c.end()
        if i % 7 == 6:  # the resolver reads copies and hands the slots back
            gpu.complete()
            assert obs.force_flush(10)
    gpu.complete()
    assert obs.force_flush(10)
    return obs.snapshot()


def run(clock: FakeNativeCopyClock, gpu: FakeGpu, accs: list[Any]) -> tuple[Any, list[Any]]:
    mem = specobs.MemorySink()
    obs = specobs.configure(sinks=[mem], clock=clock, sample_every=8, poll_interval_seconds=3600)
    try:
        return cycles(obs, gpu, accs), list(mem.cycles)
    finally:
        obs.shutdown(5)


def native_ring() -> bool:
    from specobs import _ring

    return bool(_ring.NATIVE)


ACCS = [FakeDeviceArray([i % 5, (i * 3) % 5, 4 - i % 5][: 1 + i % 3]) for i in range(60)]


def test_the_native_copy_counts_what_the_python_copy_counts() -> None:
    gpu_n, gpu_p = FakeGpu(), FakeGpu()
    native, python = FakeNativeCopyClock(gpu_n), FakeNativeCopyClock(gpu_p, native=False)
    sn, cn = run(native, gpu_n, ACCS)
    sp, cp = run(python, gpu_p, ACCS)
    assert [c.accept_lengths for c in cn] == [c.accept_lengths for c in cp] == [
        a.values for a in ACCS]
    for name in ("cycles_total", "accepted_tokens_total", "draft_tokens_total",
                 "emitted_tokens_total", "accepted_by_position", "errors", "dropped"):
        assert getattr(sn, name) == getattr(sp, name), name
    assert sn.accept_length.counts == sp.accept_length.counts
    assert not any(sn.errors.values()), sn.errors
    assert len(native.free) == len(python.free) == 16  # every slot came back
    assert python.memcpy_calls == 0 and python.copies == 60
    if native_ring():
        # One event for the first copy and one for each 16th after it: the other copies are
        # read once their values landed over the sentinel.
        assert (native.memcpy_calls, native.record_calls, native.copies) == (60, 4, 0)
    else:  # the pure-Python ring: every copy through copy_to_host
        assert (native.memcpy_calls, native.copies) == (0, 60)


@pytest.mark.parametrize("native", [True, False])
def test_the_engine_threads_copy_time_is_exported_as_specobs_cpu(native: bool) -> None:
    # specobs_exporter_cpu_time_seconds_total{component="acceptance_copy"}: the worker's time in
    # the copies, all of it, from the first copy on; absent while acceptance is host data.
    gpu = FakeGpu()
    clock = FakeNativeCopyClock(gpu, native=native)
    obs = specobs.configure(sinks=[], clock=clock, sample_every=8, poll_interval_seconds=3600)
    try:
        s = cycles(obs, gpu, [[1, 2], [4]] * 10)
        assert "acceptance_copy" not in s.cpu_seconds and s.cpu_seconds["resolver"] > 0
        s = cycles(obs, gpu, ACCS[:20])
        copied = obs._recorder.copy_ns
        assert copied > 0
        assert s.cpu_seconds["acceptance_copy"] == pytest.approx(copied / 1e9, rel=1e-9)
        s = cycles(obs, gpu, ACCS[20:40])
        assert obs._recorder.copy_ns > copied
        assert s.cpu_seconds["acceptance_copy"] == pytest.approx(
            obs._recorder.copy_ns / 1e9, rel=1e-9)
        assert s.accepted_tokens_total == 70 + sum(sum(a.values) for a in ACCS[:40])
        assert not any(s.errors.values()), s.errors
    finally:
        obs.shutdown(5)


@pytest.mark.skipif(not native_ring(), reason="the pure-Python ring starts no copy itself")
def test_a_refused_copy_goes_through_the_python_path_and_a_refused_event_through_the_clock(
) -> None:
    gpu = FakeGpu()
    clock = FakeNativeCopyClock(gpu)
    clock.memcpy_rc = 1  # cudaErrorInvalidValue: the runtime refuses every copy
    snap, cycles = run(clock, gpu, ACCS[:10])
    assert [c.accept_lengths for c in cycles] == [a.values for a in ACCS[:10]]
    assert (clock.memcpy_calls, clock.lasterr_calls, clock.copies) == (10, 10, 10)
    assert len(clock.free) == 16 and not any(snap.errors.values())

    gpu = FakeGpu()
    clock = FakeNativeCopyClock(gpu, fence_every=1)  # every copy records its event
    clock.record_rc = 1  # the copy is started, its event is not recorded by the runtime
    snap, cycles = run(clock, gpu, ACCS[:10])
    assert [c.accept_lengths for c in cycles] == [a.values for a in ACCS[:10]]
    assert (clock.memcpy_calls, clock.event_fallbacks, clock.copies) == (10, 10, 0)
    assert clock.lasterr_calls == 10 and len(clock.free) == 16


@pytest.mark.skipif(not native_ring(), reason="the pure-Python ring starts no copy itself")
@pytest.mark.parametrize("tensor", [
    FakeDeviceArray([1, 2], device=1),  # another device than the clock's
    FakeDeviceArray([1, 2], contiguous=False),
    FakeDeviceArray(list(range(65))),  # longer than a slot (the Python path refuses it too)
])
def test_tensors_the_core_cannot_copy_are_left_to_the_python_path(tensor: Any) -> None:
    gpu = FakeGpu()
    clock = FakeNativeCopyClock(gpu)
    snap, cycles = run(clock, gpu, [tensor])
    assert clock.memcpy_calls == 0
    if tensor.numel() > clock.capacity:
        assert cycles[0].accept_lengths is None and snap.errors["bad_acceptance"] == 1
    else:
        assert clock.copies == 1 and cycles[0].accept_lengths == [1, 2]


@pytest.mark.parametrize("pump", [False, True])
def test_the_resolver_is_woken_when_the_free_slots_run_low(pump: bool) -> None:
    """Slots come back only once the resolver has read them: the copy that leaves fewer than a
    quarter free wakes it at once, on both paths (8 slots: the 7th copy). Where the native
    ring's pump runs, the copy wakes the pump for a pass instead (no Python on the worker):
    it parks the slots it read, and the next copies take them back."""
    gpu = FakeGpu()
    clock = FakeNativeCopyClock(gpu, buffers=8)
    obs = specobs.configure(sinks=[], clock=clock, poll_interval_seconds=3600)
    rec = obs._recorder
    ring = rec.ring
    pumping = pump and hasattr(ring, "pump")
    if not pumping:
        obs._resolver.tune(Tuning(use_pump=False))
    deadline = time.monotonic() + 10
    while getattr(ring, "pumping", 0) != pumping and time.monotonic() < deadline:
        time.sleep(0.005)
    passes = getattr(ring, "pump_passes", 0)
    wakes: list[int] = []
    wake = rec.wake

    def counting_wake() -> None:
        wakes.append(len(clock.free))
        wake()

    rec.wake = counting_wake  # type: ignore[method-assign]
    try:
        for i in range(7):
            if i == 6:
                assert wakes == []  # six copies in flight, two slots free
            c = obs.begin()
            c.mark("verify")
            c.accept(FakeDeviceArray([i % 4]), draft_length=4)
            c.mark("bookkeeping")
            c.end()
        if pumping:
            assert wakes == []
            while ring.pump_passes == passes and time.monotonic() < deadline + 10:
                time.sleep(0.005)
            assert ring.pump_passes > passes
        else:
            assert wakes[:1] == [1]
        gpu.complete()
        assert obs.force_flush(10)
        assert len(clock.free) == 8 and obs.snapshot().cycles_total == 7
    finally:
        obs.shutdown(5)


def _cycles(obs: specobs.Observer, gpu: FakeGpu, accs: list[Any]) -> None:
    for acc in accs:
        c = obs.begin()
        gpu.run(10)
        c.mark("verify")
        c.accept(FakeDeviceArray(acc), draft_length=4)
        gpu.run(5)
        c.mark("bookkeeping")
        c.end()


@pytest.mark.skipif(not native_ring(), reason="the pure-Python ring records every copy's event")
def test_copies_without_an_event_wait_for_their_values_and_never_for_the_next_fence() -> None:
    """One copy in ``fence_every`` records its event; the others are read once the GPU wrote
    their values over the sentinel: never before (nothing is read from a copy in flight), and
    without waiting for a later fence, so the last cycles before the engine goes idle count."""
    gpu = FakeGpu()
    clock = FakeNativeCopyClock(gpu, fence_every=16)
    obs = specobs.configure(sinks=[], clock=clock, sample_every=10**6,
                            poll_interval_seconds=3600)
    try:
        _cycles(obs, gpu, [[1, 2], [3], [0, 4]])
        assert not obs.force_flush(0.3)  # all three copies in flight
        assert obs.snapshot().accepted_tokens_total == 0
        gpu.complete()  # the GPU ran them; no event after the first copy's
        _cycles(obs, gpu, [[2, 2]])  # and one more in flight behind them
        assert not obs.force_flush(0.3)
        snap = obs.snapshot()
        assert (snap.cycles_total, snap.accepted_tokens_total) == (3, 10)
        gpu.complete()
        assert obs.force_flush(10)
        snap = obs.snapshot()
        assert (snap.cycles_total, snap.accepted_tokens_total) == (4, 14)
        assert clock.record_calls == 1 and obs._recorder.ring.native_fences == 1
        assert not any(snap.errors.values()) and len(clock.free) == 16
    finally:
        obs.shutdown(5)


@pytest.mark.skipif(not native_ring(), reason="the pure-Python ring records every copy's event")
def test_a_copy_whose_values_never_land_is_settled_by_a_later_copy_or_event() -> None:
    """Negative counts read like the sentinel: such a copy completed once a later copy's values
    landed (stream order), or, when none do, once a later fenced copy's event completed; it is
    counted as bad acceptance then, and holds the cycles after it until that happens."""
    gpu = FakeGpu()
    clock = FakeNativeCopyClock(gpu, fence_every=4)  # fences: the 1st copy, the 5th, the 9th
    obs = specobs.configure(sinks=[], clock=clock, sample_every=10**6,
                            poll_interval_seconds=3600)
    try:
        _cycles(obs, gpu, [[1], [2], [-1, 3]])
        gpu.complete()
        assert not obs.force_flush(0.3)
        assert obs.snapshot().cycles_total == 2  # nothing after the third says it completed
        _cycles(obs, gpu, [[4]])
        gpu.complete()
        assert obs.force_flush(10)  # the fourth landed: the third completed before it
        snap = obs.snapshot()
        assert snap.cycles_total == 4 and snap.errors["bad_acceptance"] == 1
        assert clock.record_calls == 1  # no event was needed

        _cycles(obs, gpu, [[-1], [-1], [-1], [-2]])  # the 5th..8th: none lands
        gpu.complete()
        assert not obs.force_flush(0.3)
        _cycles(obs, gpu, [[-3]])  # the 9th is fenced: its event settles all five
        gpu.complete()
        assert obs.force_flush(10)
        snap = obs.snapshot()
        assert snap.cycles_total == 9 and snap.errors["bad_acceptance"] == 6
        assert snap.accepted_tokens_total == 1 + 2 + 4
        assert clock.record_calls == 3 and len(clock.free) == 16
    finally:
        obs.shutdown(5)


@pytest.mark.parametrize("seed", range(12))
def test_the_poll_never_reads_a_cycle_in_flight_and_equals_its_specification(seed: int) -> None:
    """Random streams of CUDA acceptance copies (fenced one in ``fence_every``, some with
    values that never land over the sentinel), sampled cycles with events, and a GPU that
    completes its stream up to random points: the ring's poll never puts a cycle in flight
    below its bound, reaches every cycle once the GPU is done, and the native core's one-call
    poll returns what its specification (``_ring.poll_pending`` over ``pending``) returns,
    with the same memory of the copy first in flight."""
    import random

    from specobs import _ring
    from specobs._stages import IN_FLIGHT_POLLS_BEFORE_QUERY as POLLS

    rng = random.Random(seed)
    gpu = FakeGpu()
    clock = FakeNativeCopyClock(gpu, buffers=96, fence_every=rng.choice([1, 3, 16]))
    obs = specobs.configure(sinks=[], clock=clock, sample_every=rng.choice([4, 7, 1000]),
                            poll_interval_seconds=3600)
    rec = obs._recorder
    rec.wake = lambda: None  # type: ignore[method-assign]  # the test drains, not the thread
    ring = rec.ring
    ring.wake_at = 1 << 30
    # Cycle index -> timeline positions of its copy (enqueued in accept()) and its last event.
    copied_at: dict[int, int] = {}
    ended_at: dict[int, int] = {}
    polled = 0
    try:
        for _ in range(60):
            for _ in range(rng.randint(0, 6)):
                c = obs.begin(batch_size=2)
                gpu.run(rng.randint(1, 9))
                c.mark("verify")
                vals = [rng.randint(0, 4), rng.randint(0, 4)]
                u = rng.random()
                if u < 0.05:
                    vals[0] = -1  # never lands over the sentinel
                elif u < 0.1:
                    vals[1] = 200  # lands (a low byte over 127), then refused as too long
                c.accept(FakeDeviceArray(vals), draft_length=4)
                copied_at[c.index] = gpu.now_ns
                gpu.run(rng.randint(1, 9))
                c.mark("bookkeeping")
                gpu.run(rng.randint(1, 9))
                c.end()
                ended_at[c.index] = gpu.now_ns
            gpu.complete_until(rng.randint(gpu.completed_ns, gpu.now_ns))
            for _ in range(rng.randint(1, 3)):
                limit = rng.choice([1, 5, 64])
                held, bound = ring.pending(limit)
                memory = [ring.in_flight_index, ring.in_flight_polls]
                want = _ring.poll_pending(held, bound, clock.query, POLLS, memory)
                got = ring.poll(limit, clock.query, POLLS)
                if held:
                    assert got == want
                else:  # nothing to ask: the open cycle's index, or the next, without a walk
                    assert ring.held_cycles == 0 and got >= want
                assert [ring.in_flight_index, ring.in_flight_polls] == memory
                assert ring.held_cycles == len(ring.pending(1 << 30)[0])
                for idx, ev, copy in held:
                    if idx < got:  # what the drain may read now has landed and completed
                        if ev is not None:
                            assert ended_at[idx] <= gpu.completed_ns, (idx, got)
                        if copy is not None:
                            assert copied_at[idx] <= gpu.completed_ns, (idx, got)
                polled += len(held)
            if rng.random() < 0.4:
                obs._resolver.drain()
        # A copy whose values never land is settled only by a later event on its stream: the
        # engine runs on for a fence's worth of clean cycles, as it does while serving.
        for _ in range(clock.fence_every + 1):
            c = obs.begin(batch_size=1)
            c.mark("verify")
            c.accept(FakeDeviceArray([1]), draft_length=4)
            c.mark("bookkeeping")
            c.end()
            ended_at[c.index] = gpu.now_ns
        gpu.complete()
        for _ in range(POLLS + 1):
            obs._resolver.drain()
        assert len(ring) == 0
        assert obs.snapshot().cycles_total == len(ended_at)
        assert polled > 50  # the streams held copies for the poll to look at
    finally:
        obs.shutdown(5)


@pytest.mark.skipif(not native_ring(), reason="the pure-Python ring always holds the GIL")
def test_completed_native_copies_are_read_by_the_walk_without_the_gil() -> None:
    """A native copy's pinned buffer, element size and length are kept in its slot, so the
    drain's walk without the GIL reads completed copies itself: every count exact, every pinned
    slot back in its pool, values out of range left for the resolver's validation."""
    gpu = FakeGpu()
    clock = FakeNativeCopyClock(gpu, buffers=256)
    obs = specobs.configure(sinks=[], clock=clock, sample_every=1 << 30,
                            poll_interval_seconds=3600)
    ring = obs._recorder.ring
    want_acc = 0
    try:
        for i in range(200):
            c = obs.begin(batch_size=3)
            c.mark("verify")
            vals = [i % 5, (i * 3) % 5, 4 - i % 5]
            if i == 150:
                vals[1] = 7  # above the draft length: the resolver counts it as bad
            else:
                want_acc += sum(vals)
            c.accept(FakeDeviceArray(vals), draft_length=4)
            c.mark("bookkeeping")
            c.end()
        gpu.complete()
        assert obs.force_flush(10)
        s = obs.snapshot()
        assert s.cycles_total == 200
        assert s.accepted_tokens_total == want_acc
        assert s.draft_tokens_total == 199 * 3 * 4
        assert s.errors["bad_acceptance"] == 1
        assert ring.nogil_cycles >= 150  # the walk took the copies up to the bad one at least
        assert len(clock.free) == 256  # every pinned slot came back
    finally:
        obs.shutdown(5)


def test_a_dropped_clock_starts_no_copy_and_samples_nothing() -> None:
    """What a forked child does with a CUDA clock (``Recorder.drop_clock``): the host clock only,
    no sampled events, no acceptance copy started natively or through the clock."""
    gpu = FakeGpu()
    clock = FakeNativeCopyClock(gpu)
    obs = specobs.configure(sinks=[], clock=clock, sample_every=1, poll_interval_seconds=3600)
    try:
        obs._recorder.drop_clock()
        for _ in range(5):
            with obs.cycle(batch_size=2) as c:
                c.mark("verify")
                c.mark("bookkeeping")
                c.accept(FakeDeviceArray([1, 2]), draft_length=4)
        assert obs.force_flush(10)
        s = obs.snapshot()
        assert s.cycles_total == 5
        assert clock.memcpy_calls == 0 and clock.copies == 0 and clock.record_calls == 0
        assert obs.clock is None
    finally:
        obs.shutdown(5)
