"""The native ring's pump: the resolver's thread waits, polls and walks inside one C call with the
GIL let go (``Ring.pump``), and comes back to Python only for what needs it -- a cycle to trace,
kept objects to validate, a deferred cycle past its timeout, parked references to hand back, a
drop or misuse counted, a new recording thread, a wake. The export path does the rest of the
resolver's Python before each snapshot (``Resolver.catch_up``).

Each test compares what the pump counts with what the loop of waits and drains counts
(``Tuning(use_pump=False)``), or with the exact figures of the stream it ran, and checks that
the resolver's thread stayed in C where it should. The worker lets go of the GIL between cycles
as an engine waiting on its GPU does, so the pump runs beside it."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import specobs
from specobs import _ring
from specobs._holds import HoldMeter, Tuning
from specobs.timing import FakeDeviceArray, FakeGpu, FakeNativeCopyClock
from specobs.timing.fake import FakeNativeEventClock
from tests import test_nogil_drain as nogil_drain

pytestmark = pytest.mark.skipif(not _ring.NATIVE, reason="the pump is the native ring's")

_WORK = bytes(1 << 14)


def host_cycles(obs: specobs.Observer, n: int) -> None:
    """tests/test_nogil_drain.py's stream (13 of 32 tokens a cycle), a shorter wait."""
    nogil_drain.host_cycles(obs, n, _WORK)


def metered(obs: specobs.Observer) -> Any:
    """The observer's resolver, with a meter of its holds and pump returns attached."""
    res = obs._resolver
    res.tune(meter=HoldMeter())
    return res


def settled(obs: specobs.Observer) -> None:
    """After a flush: its last wakes brought the pump back once more; wait until it is in C
    again and has stayed there for 0.3 s, so what follows sees only what the stream makes it do
    (however slowly a loaded machine runs the resolver's thread)."""
    res = obs._resolver
    ring = obs._recorder.ring
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        before = dict(res.meter.pump_returns)
        time.sleep(0.3)
        if ring.pumping == 1 and res.meter.pump_returns == before:
            return
    raise AssertionError(f"the pump never settled: {res.meter.pump_returns}")


def wait_for(cond: Callable[[], bool], seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def settled_observer(warm: int) -> specobs.Observer:
    """A host-clock observer that ran ``warm`` cycles, flushed, and whose pump settled in C."""
    obs = specobs.configure(sinks=[], clock="host", poll_interval_seconds=0.001)
    metered(obs)
    try:
        host_cycles(obs, warm)
        assert obs.force_flush(10)
        settled(obs)
    except BaseException:
        obs.shutdown(5)
        raise
    return obs


def test_the_steady_state_stays_in_c_and_counts_every_cycle_once() -> None:
    n = 30_000
    obs = settled_observer(500)
    res = obs._resolver
    ring = obs._recorder.ring
    try:
        returns = dict(res.meter.pump_returns)
        holds = len(res.meter.holds)
        walked = ring.pump_walked
        host_cycles(obs, n)
        # Nothing in the stream needs Python: the resolver's thread never came back to it, and
        # held the GIL not once, while the pump walked the cycles beside the worker.
        assert wait_for(lambda: ring.pump_walked - walked == n), ring.pump_walked - walked
        assert res.meter.pump_returns == returns
        assert len(res.meter.holds) == holds
        assert ring.pumping == 1
        assert obs.force_flush(10)
        s = obs.snapshot()
    finally:
        obs.shutdown(5)
    m = n + 500
    assert s.dropped_total() == 0
    assert s.cycles_total == m
    assert s.accepted_tokens_total == 13 * m
    assert s.draft_tokens_total == 32 * m
    assert list(s.accept_length.counts[:5]) == [2 * m, 2 * m, 2 * m, m, m]
    assert s.batch_size.count == m


def test_a_snapshot_catches_up_what_the_resolver_would_have_done() -> None:
    """Counts made in Python on the worker, the pump's cycles for force_flush's count and the
    sampler's figures reach a snapshot without the resolver's thread coming back to Python."""
    obs = settled_observer(200)
    res = obs._resolver
    ring = obs._recorder.ring
    try:
        returns = dict(res.meter.pump_returns)
        consumed = res.consumed
        host_cycles(obs, 3000)
        assert wait_for(lambda: len(ring) == 0)
        obs._recorder.misuse("bad_acceptance", "made in Python on the worker")
        s = obs.snapshot()  # no flush
        assert res.meter.pump_returns == returns
        assert s.cycles_total == 3200
        assert s.errors.get("bad_acceptance") == 1
        assert res.consumed - consumed == 3000  # what force_flush waits for
        assert s.overhead_ratio is not None and s.overhead_ratio > 0
    finally:
        obs.shutdown(5)


def test_another_threads_drain_walks_beside_the_pump_without_bringing_it_back() -> None:
    obs = specobs.configure(sinks=[], clock="host", poll_interval_seconds=3600)
    res = metered(obs)
    ring = obs._recorder.ring
    ring.wake_at = 1 << 30  # no pass of the pump's own: the drains here take everything
    try:
        assert wait_for(lambda: ring.pumping == 1)
        returns = dict(res.meter.pump_returns)
        total = 0
        for _ in range(5):
            host_cycles(obs, 400)
            total += res.drain()
        assert total == 2000 and len(ring) == 0
        assert res.meter.pump_returns == returns and ring.pumping == 1
        assert obs.snapshot().cycles_total == 2000
    finally:
        obs.shutdown(5)


class TraceSink(specobs.MemorySink):
    def __init__(self) -> None:
        super().__init__(max_cycles=1 << 20, traces=True)
        self.wants_cycles = False


@pytest.mark.parametrize("pump", [True, False])
def test_every_cycle_picked_for_a_trace_is_traced(pump: bool) -> None:
    """The pump stops at the next cycle the resolver picked (Python traces it): none is walked
    past. Head sampling at 2 %: the traced count is binomial around 2 % of the stream."""
    n, rate = 20_000, 0.02
    mem = TraceSink()
    obs = specobs.configure(sinks=[mem], clock="host", poll_interval_seconds=0.001,
                            trace_head_rate=rate)
    obs._resolver.tune(Tuning(use_pump=pump), HoldMeter())
    try:
        host_cycles(obs, n)
        assert obs.force_flush(10)
        s = obs.snapshot()
    finally:
        obs.shutdown(5)
    traced = [c for c in mem.cycles if c.trace_id is not None]
    assert s.cycles_total == n
    assert len({c.index for c in traced}) == len(traced)
    assert 300 <= len(traced) <= 500, len(traced)  # 400 expected, sd 20
    assert all(c.accepted == 13 and c.drafted == 32 for c in traced)
    if pump:  # back in Python for each: the drain then takes what waits, the pump goes on
        assert obs._recorder.ring.pump_walked > 0
        assert obs._resolver.meter.pump_returns.get("python", 0) > 0


def test_a_deferred_cycle_never_settled_is_handed_on_while_pumping() -> None:
    obs = specobs.configure(sinks=[], clock="host", poll_interval_seconds=0.002,
                            settle_timeout_seconds=0.2)
    res = metered(obs)
    try:
        host_cycles(obs, 10)
        with obs.cycle(batch_size=2) as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.defer()  # never settled
        host_cycles(obs, 10)
        assert wait_for(lambda: obs.snapshot().dropped.get("unsettled", 0) == 1)
        assert obs.force_flush(10)
        s = obs.snapshot()
        assert s.cycles_total == 21
        assert res.meter.pump_returns.get("expire", 0) >= 1
    finally:
        obs.shutdown(5)


def _unpolled_observer(queue_size: int) -> specobs.Observer:
    """A host-clock observer with no poll of its own and a settle timeout no test reaches."""
    return specobs.configure(sinks=[], clock="host", poll_interval_seconds=3600,
                             settle_timeout_seconds=3600, queue_size=queue_size)


def _one_deferred_cycle_short_of_the_backlog(obs: specobs.Observer) -> None:
    """A deferred cycle never settled, then ``settle_backlog - 1`` host cycles behind it."""
    with obs.cycle(batch_size=2) as c:
        c.mark("verify")
        c.mark("bookkeeping")
        c.defer()  # never settled
    host_cycles(obs, obs._recorder.ring.settle_backlog - 1)


def test_a_deferred_cycle_never_settled_is_handed_on_at_the_backlog_while_pumping() -> None:
    """The backlog rule in C: with a timeout no test reaches and no poll of its own, the
    worker signals the pump once ``settle_backlog`` cycles wait behind a deferred one, and the
    pump comes back to Python to hand it on (``expire``); one cycle fewer, and it waits."""
    obs = _unpolled_observer(queue_size=256)
    res = metered(obs)
    backlog = obs._recorder.ring.settle_backlog
    try:
        _one_deferred_cycle_short_of_the_backlog(obs)
        time.sleep(0.2)
        assert obs.snapshot().dropped.get("unsettled", 0) == 0
        host_cycles(obs, 1)
        assert wait_for(lambda: obs.snapshot().dropped.get("unsettled", 0) == 1)
        assert res.meter.pump_returns.get("expire", 0) >= 1
        assert obs.force_flush(10)
        assert obs.snapshot().cycles_total == backlog + 1
    finally:
        obs.shutdown(5)


def _snapshots_until(obs: specobs.Observer, stop: threading.Event) -> None:
    while not stop.is_set():
        obs.snapshot()


def test_a_wake_that_meets_a_snapshot_walking_the_ring_is_not_lost() -> None:
    """The pump takes its wake and then yields the ring to a snapshot's drain; that drain stops
    at the deferred cycle and never expires it, so the pump must still walk once afterwards.
    The race is timing-dependent: each trial hands on the backlog's last cycle while another
    thread takes snapshots without pause, and the deferred cycle must be handed on every time."""
    for _ in range(25):
        obs = _unpolled_observer(queue_size=64)
        stop = threading.Event()

        walker = threading.Thread(target=_snapshots_until, args=(obs, stop))
        try:
            _one_deferred_cycle_short_of_the_backlog(obs)
            walker.start()
            host_cycles(obs, 1)
            time.sleep(0.01)
            stop.set()
            walker.join()
            assert wait_for(lambda o=obs: o.snapshot().dropped.get("unsettled", 0) == 1, 5)
        finally:
            stop.set()
            if walker.is_alive():
                walker.join()
            obs.shutdown(5)


def gpu_cycles(obs: specobs.Observer, gpu: FakeGpu, n: int, acc: Callable[[int], Any]) -> None:
    for i in range(n):
        with obs.cycle(batch_size=3) as c:
            gpu.run(1000 + i % 7)
            c.mark("verify")
            gpu.run(2500 + 3 * (i % 5))
            c.accept(acc(i), draft_length=4)
            c.mark("bookkeeping")
            gpu.run(300)
        if i % 40 == 39:
            gpu.complete()
            # The resolver walks what completed before the worker goes on: on a loaded machine
            # a resolver that lags would otherwise let the event pool run dry (drops), and the
            # runs compared would differ by what they dropped.
            assert wait_for(lambda: len(obs._recorder.ring) == 0)


def run_events(pump: bool, n: int, pool: int) -> tuple[specobs.Snapshot, dict[str, int], Any]:
    gpu = FakeGpu()
    clock = FakeNativeEventClock(gpu, pool_size=pool)
    obs = specobs.configure(sinks=[], clock=clock, sample_every=2, poll_interval_seconds=0.002,
                            max_draft_length=4, trace_head_rate=0.0)
    obs._resolver.tune(Tuning(use_pump=pump), HoldMeter())
    try:
        gpu_cycles(obs, gpu, n, lambda i: [i % 5, (i * 3) % 5, 4 - i % 5])
        gpu.complete()
        assert obs.force_flush(30)
        return obs.snapshot(), dict(obs._resolver.meter.pump_returns), obs._recorder.ring
    finally:
        obs.shutdown(5)


@pytest.mark.parametrize("pool", [4096, 256])
def test_sampled_cycles_are_read_by_the_pump_as_by_the_drain(pool: int) -> None:
    """The pump asks a sampled cycle's last event and reads its GPU times through the runtime
    (a fake one written in C here), and parks the event lists until the resolver hands them back
    to the clock: a quarter of the pool at most, so a small pool never runs dry."""
    n = 2000
    with_pump, returns, ring = run_events(True, n, pool)
    without, _, _ = run_events(False, n, pool)
    assert with_pump.dropped_total() == without.dropped_total() == 0
    assert with_pump.cycles_total == without.cycles_total == n
    assert with_pump.sampled_cycles_total == without.sampled_cycles_total == n // 2
    for key, h in with_pump.phase_histograms.items():  # the fake GPU's times: exact
        if key[1] != "gpu":
            continue
        assert h.counts == without.phase_histograms[key].counts, key
        assert h.sum == without.phase_histograms[key].sum, key
    assert with_pump.phase_histograms[("verify", "gpu")].count == n // 2
    assert with_pump.accept_length.counts == without.accept_length.counts
    # Every pooled event's handle was cached when the native reads were set up: the pump never
    # came back for a sampled cycle's handles, only to hand parked events to the clock (whose
    # drain then takes what else waits).
    assert ring.pump_walked > n // 4
    assert returns.get("python", 0) == 0
    if pool == 256:  # 64 cycles' events: the pump comes back every 16 sampled cycles
        assert ring.park_events == 16
        assert returns.get("parked", 0) > 0


def run_copies(pump: bool, n: int) -> tuple[specobs.Snapshot, FakeNativeCopyClock, Any]:
    gpu = FakeGpu()
    clock = FakeNativeCopyClock(gpu, buffers=256, fence_every=4)  # the CUDA clock's
    obs = specobs.configure(sinks=[], clock=clock, sample_every=1000,
                            poll_interval_seconds=0.002, max_draft_length=4)
    obs._resolver.tune(Tuning(use_pump=pump), HoldMeter())
    try:
        gpu_cycles(obs, gpu, n, lambda i: FakeDeviceArray([i % 5, (i * 3) % 5, 4 - i % 5]))
        gpu.complete()
        assert obs.force_flush(30)
        return obs.snapshot(), clock, obs._recorder.ring
    finally:
        obs.shutdown(5)


def test_native_copies_are_read_by_the_pump_and_go_back_to_their_pool() -> None:
    n = 3000
    with_pump, clock, ring = run_copies(True, n)
    without, _, _ = run_copies(False, n)
    assert with_pump.dropped_total() == 0 and not any(with_pump.errors.values())
    assert with_pump.cycles_total == n
    assert with_pump.accepted_tokens_total == without.accepted_tokens_total
    assert with_pump.accept_length.counts == without.accept_length.counts
    assert with_pump.draft_tokens_total == 12 * n
    assert ring.pump_walked > n // 2
    assert len(clock.free) == 256  # every buffer back in its pool
    assert ring.park_copies == 256


def test_the_pump_comes_back_for_a_stop_and_a_shutdown_is_bounded() -> None:
    obs = specobs.configure(sinks=[], clock="host", poll_interval_seconds=3600)
    ring = obs._recorder.ring
    assert wait_for(lambda: ring.pumping == 1)
    t = obs._resolver._thread
    assert t is not None
    t0 = time.monotonic()
    obs.shutdown(5)
    assert time.monotonic() - t0 < 2.0
    assert not t.is_alive() and ring.pumping == 0


def test_a_second_pump_on_the_same_ring_is_refused() -> None:
    obs = specobs.configure(sinks=[], clock="host", poll_interval_seconds=3600)
    ring = obs._recorder.ring
    try:
        assert wait_for(lambda: ring.pumping == 1)
        with pytest.raises(RuntimeError, match="another thread"):
            ring.pump(1_000_000, -1, -1, -1, 0)
    finally:
        obs.shutdown(5)


def test_a_forked_child_pumps_its_own_cycles() -> None:
    import os

    obs = specobs.configure(sinks=[], clock="host", poll_interval_seconds=0.001)
    ring = obs._recorder.ring
    try:
        host_cycles(obs, 300)
        # Nothing queued at the fork (the child would count it dropped, reason "fork").
        assert wait_for(lambda: ring.pumping == 1 and len(ring) == 0)
        walked = ring.pump_walked  # the child inherits the count
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: a fresh resolver thread, pumping the child's cycles
            code = 1
            try:
                host_cycles(obs, 1000)
                ok = wait_for(lambda: ring.pumping == 1 and ring.pump_walked > walked, 10)
                obs.force_flush(10)
                s = obs.snapshot()
                code = 0 if ok and s.cycles_total == 1000 and s.dropped_total() == 0 else 2
            finally:
                os.write(w, bytes([code]))
                os._exit(0)
        os.close(w)
        got = os.read(r, 1)
        os.waitpid(pid, 0)
        assert got == b"\x00"
        host_cycles(obs, 100)
        assert obs.force_flush(10)
        assert obs.snapshot().cycles_total == 400
    finally:
        obs.shutdown(5)


def test_a_worker_filling_the_ring_wakes_a_pass_not_python() -> None:
    """Past ``wake_at`` waiting cycles the ring wakes the pump itself (no Python call on the
    worker): the pump walks them, on a poll interval far longer than the run."""
    obs = specobs.configure(sinks=[], clock="host", poll_interval_seconds=3600, queue_size=4096)
    res = metered(obs)
    ring = obs._recorder.ring
    try:
        host_cycles(obs, 10)  # the pump comes back once for the new recording thread
        assert obs.force_flush(10)
        settled(obs)
        returns = dict(res.meter.pump_returns)
        host_cycles(obs, 20_000)  # five rings' worth
        assert wait_for(lambda: ring.pump_walked >= 20_000 - ring.wake_at)
        assert res.meter.pump_returns == returns
        assert obs.force_flush(10)
        s = obs.snapshot()
        assert s.cycles_total == 20_010 and s.dropped_total() == 0
    finally:
        obs.shutdown(5)


def random_stream(obs: specobs.Observer, seed: int) -> None:
    """Cycles of every accept input form (good and bad values, keywords, batch sizes), misuse of
    every kind, and the worker letting go of the GIL now and then so the pump walks beside it."""
    import random

    from tests.test_ring import acceptance_input

    rng = random.Random(seed)
    for i in range(1500):
        u = rng.random()
        c = obs.begin(batch_size=rng.choice([None, 4, 8, -1, "8"])) if u < 0.3 else obs.begin()
        if rng.random() < 0.03:
            obs.begin().end()  # begin while open: the first is discarded (misuse)
            continue
        c.mark("verify")
        if rng.random() > 0.02:
            c.mark("bookkeeping")  # else: end() before the last phase (misuse)
        if rng.random() < 0.9:
            acc, kw = acceptance_input(rng)
            c.accept(acc, **kw)
        c.end()
        if rng.random() < 0.02:
            c.end()  # twice
        if rng.random() < 0.02:
            c.accept([1], draft_length=2)  # after the end
        if i % 7 == 0:
            hashlib.sha256(_WORK).digest()


def snapshot_of_stream(native: bool, seed: int) -> dict[str, Any]:
    old = _ring.NATIVE
    _ring.NATIVE = native
    try:
        obs = specobs.configure(sinks=[], clock="host", poll_interval_seconds=0.001,
                                max_draft_length=6, queue_size=1 << 14)
    finally:
        _ring.NATIVE = old
    ring = obs._recorder.ring
    assert (type(ring).__module__ == "specobs._core") == native
    ring.tick = 997  # every clock read advances 997 ns: the same stream, the same times
    try:
        random_stream(obs, seed)
        assert obs.force_flush(20)
        s = obs.snapshot()
        if native:  # it ran (how much it walked, against the drains, depends on timing: a
            # stream this full of misuse brings it back to Python every few cycles)
            assert ring.pump_calls > 0
    finally:
        obs.shutdown(5)
    return {
        "cycles": s.cycles_total,
        "tokens": (s.draft_tokens_total, s.accepted_tokens_total, s.emitted_tokens_total),
        "histograms": {k: (h.counts, h.sum) for k, h in s.phase_histograms.items()},
        "cycle": {k: (h.counts, h.sum) for k, h in s.cycle_histograms.items()},
        "accept_length": (s.accept_length.counts, s.accept_length.sum),
        "batch": (s.batch_size.counts, s.batch_size.sum),
        "dropped": s.dropped,
        "errors": s.errors,
    }


@pytest.mark.parametrize("seed", range(4))
def test_random_streams_through_the_pump_equal_the_specification(seed: int) -> None:
    """The same random stream through an observer on the native ring, whose pump walks beside
    the worker, and on the pure-Python ring (the specification, no pump): every count, every
    histogram bucket and sum, every drop and error the same (a counting clock makes the host
    times the same)."""
    native = snapshot_of_stream(True, seed)
    python = snapshot_of_stream(False, seed)
    assert native == python
    assert native["cycles"] > 1000 and sum(native["errors"].values()) > 0
