"""GPU tests: real CUDA events, pending on purpose, and a hot path that never synchronises.

Skipped on machines without CUDA (see conftest). Run on a GPU with ``benchmarks/gpu_run.sh``.
"""

from __future__ import annotations

import statistics
import time

import pytest

import specobs

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

SLEEP_CYCLES = 200_000_000  # about 0.1 s of GPU spinning on a current GPU


@pytest.fixture
def cuda_obs():
    torch.cuda.init()
    mem = specobs.MemorySink()
    obs = specobs.configure(sinks=[mem], clock="cuda", sample_every=1,
                            poll_interval_seconds=0.001)
    yield obs, mem
    obs.shutdown(timeout_seconds=5)


def test_pending_events_are_not_resolved_and_nothing_blocks(cuda_obs):
    obs, mem = cuda_obs
    torch.cuda._sleep(1000)  # warm
    # Made before the sleep: building a CUDA tensor from a list is a pageable copy that waits.
    acc = torch.tensor([1, 3], device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with obs.cycle(batch_size=2) as c:
        torch.cuda._sleep(SLEEP_CYCLES)  # the draft phase is now pending on the GPU
        c.mark("verify")
        torch.cuda._sleep(SLEEP_CYCLES // 2)
        c.mark("bookkeeping")
        c.accept(acc, draft_length=4)
    host_s = time.perf_counter() - t0
    # The hot path returned long before the GPU finished: it never waited on it.
    assert host_s < 0.05
    assert obs.force_flush(timeout_seconds=0.01) is False
    assert obs.snapshot().cycles_total == 0
    assert obs.force_flush(timeout_seconds=30) is True
    s = obs.snapshot()
    assert s.cycles_total == 1
    assert s.accepted_tokens_total == 4
    draft = s.phase_seconds_sum("draft", "gpu")
    verify = s.phase_seconds_sum("verify", "gpu")
    assert draft > 0.02 and verify > 0.01
    assert draft / verify == pytest.approx(2.0, rel=0.15)
    # Host clock saw only launch time for draft.
    assert s.phase_seconds_sum("draft", "host") < draft / 5


def test_hot_path_never_synchronizes(cuda_obs):
    obs, mem = cuda_obs
    x = torch.randn(256, 256, device="cuda")
    acc = torch.randint(0, 5, (8,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(50):
            with obs.cycle(batch_size=8) as c:
                y = x @ x
                c.mark("verify")
                y = y @ x
                c.mark("bookkeeping")
                c.accept(acc, draft_length=4)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert obs.force_flush(timeout_seconds=30)
    s = obs.snapshot()
    assert s.cycles_total == 50
    assert s.sampled_cycles_total == 50
    assert s.accepted_tokens_total == 50 * int(acc.sum().item())
    assert s.errors == dict.fromkeys(s.errors, 0)
    del y


def test_gpu_phase_times_match_a_synchronized_reference(cuda_obs):
    obs, mem = cuda_obs
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def draft():
        for _ in range(4):
            a @ a

    def verify():
        for _ in range(12):
            a @ a

    # Warm up, then interleave: each round times both phases alone between synchronisations
    # (the reference) and then runs one instrumented cycle from the same state (a synchronised
    # GPU kept busy by a sleep kernel, so launch latency is timed on neither side). Interleaving
    # keeps the two under the same clocks: measured one after the other, the reference moved
    # by several percent between runs on a freshly started GPU while the instrumented loop did not.
    for _ in range(5):
        draft()
        verify()
    torch.cuda.synchronize()
    ref: dict[str, list[float]] = {"draft": [], "verify": []}
    beside: dict[str, list[float]] = {"draft": [], "verify": []}
    for _ in range(20):
        for name, fn in (("draft", draft), ("verify", verify)):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            torch.cuda._sleep(2_000_000)  # keep the GPU busy so launch latency is not timed
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            ref[name].append(s.elapsed_time(e) / 1e3)
        # The test's own events next to specobs's, in the same cycle: an independent reading of
        # exactly the intervals specobs reports.
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000)
        with obs.cycle() as c:
            ev[0].record()
            draft()
            ev[1].record()
            c.mark("verify")
            verify()
            ev[2].record()
            c.mark("bookkeeping")
        torch.cuda.synchronize()
        beside["draft"].append(ev[0].elapsed_time(ev[1]) / 1e3)
        beside["verify"].append(ev[1].elapsed_time(ev[2]) / 1e3)
    assert obs.force_flush(timeout_seconds=30)
    timed = [r for r in mem.cycles if r.gpu_ns is not None]
    assert len(timed) == 20
    for i, name in enumerate(("draft", "verify")):
        got = statistics.median(r.gpu_ns[i] for r in timed) / 1e9
        # Against the synchronise-isolated reference: within 3 %.
        assert got == pytest.approx(statistics.median(ref[name]), rel=0.03), (name, "reference")
        # Against the events beside specobs's in the same cycles: the same intervals, so within
        # 1 % cycle by cycle (event resolution is about half a microsecond).
        for r, other in zip(timed, beside[name], strict=True):
            assert r.gpu_ns[i] / 1e9 == pytest.approx(other, rel=0.01), (name, "beside")


def test_nothing_is_recorded_during_graph_capture(cuda_obs):
    obs, mem = cuda_obs
    x = torch.randn(64, 64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x @ x
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        with obs.cycle() as c:
            y = x @ x
            c.mark("verify")
            c.mark("bookkeeping")
    g.replay()
    torch.cuda.synchronize()
    with obs.cycle() as c:
        g.replay()
        c.mark("verify")
        c.mark("bookkeeping")
    assert obs.force_flush(timeout_seconds=30)
    snap = obs.snapshot()
    assert snap.dropped["graph_capture"] == 1
    assert snap.cycles_total == 1
    assert snap.sampled_cycles_total == 1
    del y


def test_event_pool_is_reused_without_allocation(cuda_obs):
    obs, mem = cuda_obs
    clock = obs.clock
    free0 = clock.free_events()
    x = torch.randn(128, 128, device="cuda")
    for _ in range(3 * free0 // 4):
        with obs.cycle() as c:
            x @ x
            c.mark("verify")
            c.mark("bookkeeping")
        obs.force_flush(timeout_seconds=5)
    assert clock.free_events() == free0
    assert obs.snapshot().dropped["event_pool_exhausted"] == 0


def test_auto_clock_starts_cuda_lazily_once_the_engine_did():
    torch.cuda.init()
    obs = specobs.configure(clock="auto", sample_every=1)
    x = torch.randn(64, 64, device="cuda")
    with obs.cycle() as c:
        x @ x
        c.mark("verify")
        c.mark("bookkeeping")
    assert obs.clock is not None and obs.clock.name == "cuda"
    assert obs.force_flush(timeout_seconds=10)
    assert obs.snapshot().sampled_cycles_total == 1
    obs.shutdown()


def test_the_resolver_reads_events_directly_and_pending_events_stay_pending(cuda_obs):
    # The resolver binds itself to the clock's device and reads events through the CUDA runtime
    # (one call per phase, the GIL released) once a first reading agreed with torch's.
    obs, mem = cuda_obs
    clock = obs.clock
    x = torch.randn(256, 256, device="cuda")
    for _ in range(3):
        with obs.cycle() as c:
            x @ x
            c.mark("verify")
            x @ x
            c.mark("bookkeeping")
    assert obs.force_flush(timeout_seconds=10)
    assert clock._direct_checked
    assert clock._direct_thread == obs._resolver._thread.ident
    torch.cuda.synchronize()
    with obs.cycle() as c:
        torch.cuda._sleep(SLEEP_CYCLES)
        c.mark("verify")
        torch.cuda._sleep(SLEEP_CYCLES // 2)
        c.mark("bookkeeping")
    assert obs.force_flush(timeout_seconds=0.01) is False
    assert obs.snapshot().cycles_total == 3
    assert obs.force_flush(timeout_seconds=30)
    assert obs.snapshot().cycles_total == 4
    draft, verify, _ = mem.cycles[-1].gpu_ns
    assert draft > 20_000_000 and draft / verify == pytest.approx(2.0, rel=0.15)
    assert obs.snapshot().errors == dict.fromkeys(obs.snapshot().errors, 0)


def test_direct_readings_equal_torchs_and_other_threads_keep_torchs():
    import threading

    from specobs.timing.cuda import CudaEventClock

    torch.cuda.init()
    clock = CudaEventClock(pool_size=8, pinned_buffers=2)
    evs = clock.acquire(4)
    for ev in evs:
        torch.cuda._sleep(100_000)
        clock.record_fn(ev, clock.record_stream)
    torch.cuda.synchronize()
    want = [round(evs[i].elapsed_time(evs[i + 1]) * 1e6) for i in range(3)]
    out = {}

    def resolver():
        out["bound"] = clock.bind_thread()
        out["checked"] = [clock.elapsed_ns(evs[i], evs[i + 1]) for i in range(3)]
        out["direct"] = [clock.elapsed_ns(evs[i], evs[i + 1]) for i in range(3)]
        out["query"] = clock.query(evs[-1])

    t = threading.Thread(target=resolver)
    t.start()
    t.join()
    assert out["bound"] and clock._direct_checked
    assert out["checked"] == want == out["direct"] and out["query"] is True
    # This thread never bound itself: torch's calls, same numbers.
    assert [clock.elapsed_ns(evs[i], evs[i + 1]) for i in range(3)] == want


def test_cuda_acceptance_of_any_shape_and_integer_dtype_is_copied_exactly(cuda_obs):
    obs, mem = cuda_obs
    tensors = [
        torch.tensor([1, 2, 3], device="cuda"),
        torch.tensor([[4], [0]], device="cuda", dtype=torch.int32),
        (torch.arange(10, device="cuda") % 5)[::2],  # not contiguous
        torch.tensor(3, device="cuda"),  # 0-d
    ] * 40  # the pinned slots are reused many times over
    for i, t in enumerate(tensors):
        with obs.cycle() as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept(t, draft_length=4)
        if i % 16 == 15:
            # Read before the next burst: 160 copies in a row, faster than any poll, would
            # run the 64 pinned buffers of a dtype dry (counted as bad_acceptance, another
            # test's subject), and this test is about the copies' values.
            assert obs.force_flush(timeout_seconds=30)
    assert obs.force_flush(timeout_seconds=30)
    got = [r.accept_lengths for r in mem.cycles]
    assert got == [t.reshape(-1).tolist() for t in tensors]
    s = obs.snapshot()
    assert s.accepted_tokens_total == sum(int(t.sum()) for t in tensors)
    assert s.errors == dict.fromkeys(s.errors, 0)
    # The contiguous ones went through the runtime directly, and none was refused.
    assert obs.clock.direct_hot_path and obs.clock.direct_errors == 0
    # The worker's time starting the copies is measured, and exported as specobs's CPU: a
    # runtime call a copy, at least 1 µs each and under 1 ms on any host.
    assert obs._resolver.model.copy_ewma > 0
    copy_seconds = s.cpu_seconds["acceptance_copy"]
    assert len(tensors) * 1e-6 < copy_seconds < len(tensors) * 1e-3, copy_seconds


def test_copies_without_an_event_are_read_only_once_the_gpu_wrote_them():
    """Behind 0.1 s of GPU work, 40 acceptance copies: the native core records an event for
    the 16th and 32nd only (``copy_fence_every`` 16; the warm-up copy before them was the first,
    fenced); no copy is read before the GPU wrote it, and every count is exact once it did --
    the last eight without a fence after them."""
    from specobs import _ring

    torch.cuda.init()
    mem = specobs.MemorySink()
    obs = specobs.configure(sinks=[mem], clock="cuda", sample_every=10**6,
                            poll_interval_seconds=0.001)
    try:
        base = torch.tensor([1, 3, 0, 2], device="cuda")
        # Before the sleep: the clock's start (pinning its buffers waits for the device) and
        # the kernels' first launch (lazy module loading may wait too).
        with obs.cycle() as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept((base + 1) % 5, draft_length=4)
        assert obs.force_flush(timeout_seconds=30)
        warm = obs.snapshot().accepted_tokens_total
        assert warm == 2 + 4 + 1 + 3
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        for i in range(40):
            with obs.cycle(batch_size=4) as c:
                c.mark("verify")
                c.mark("bookkeeping")
                c.accept((base + i) % 5, draft_length=4)  # computed after the sleep
        assert obs.force_flush(timeout_seconds=0.01) is False
        assert obs.snapshot().accepted_tokens_total == warm  # nothing read from a copy in flight
        assert obs.force_flush(timeout_seconds=30) is True
        want = [[(v + i) % 5 for v in (1, 3, 0, 2)] for i in range(40)]
        assert [r.accept_lengths for r in mem.cycles][1:] == want
        s = obs.snapshot()
        assert s.accepted_tokens_total == warm + sum(map(sum, want))
        assert s.errors == dict.fromkeys(s.errors, 0)
        if _ring.NATIVE:  # the warm-up copy fenced (the first), then the 17th and 33rd after it
            ring = obs._recorder.ring
            assert (ring.native_copies, ring.native_fences) == (41, 3)
    finally:
        obs.shutdown(5)


def test_the_hot_path_calls_the_runtime_with_the_gil_held_and_falls_back_when_refused():
    import ctypes

    from specobs.timing.cuda import CudaEventClock

    torch.cuda.init()
    clock = CudaEventClock(pool_size=8, pinned_buffers=2)
    # PyDLL keeps the GIL through the call; the hot path records through it.
    assert clock.direct_hot_path and isinstance(clock._lib, ctypes.PyDLL)
    assert isinstance(clock.record_stream, int)
    old = CudaEventClock(pool_size=8, pinned_buffers=2, release_gil=True)
    assert not old.direct_hot_path and not isinstance(old._lib, ctypes.PyDLL)
    assert old.record_stream is old.stream

    def timed(c):
        evs = c.acquire(3)
        for ev in evs:
            torch.cuda._sleep(200_000)
            c.record_fn(ev, c.record_stream)
        torch.cuda.synchronize()
        return [evs[i].elapsed_time(evs[i + 1]) for i in range(2)]

    direct = timed(clock)
    assert all(ms > 0.02 for ms in direct)
    assert timed(old) == pytest.approx(direct, rel=0.3)

    class Refusing:
        """The runtime refusing every enqueue (as with an invalid handle)."""

        def __init__(self, lib):
            self.lib, self.cleared = lib, 0

        def cudaEventRecord(self, event, stream):
            return 400

        def cudaMemcpyAsync(self, *args):
            return 1

        def cudaGetLastError(self):
            self.cleared += 1
            return self.lib.cudaGetLastError()

    refusing = clock._lib = Refusing(clock._lib)
    clock.record_fn = clock._direct_record_fn()
    # Redone through torch: the events still time the work, the error is cleared each time.
    assert timed(clock) == pytest.approx(direct, rel=0.3)
    assert clock.direct_errors == 3 and refusing.cleared == 3
    src = torch.arange(6, device="cuda")
    copy = clock.copy_to_host(src)
    copy.event.synchronize()
    assert copy.read() == [0, 1, 2, 3, 4, 5]
    assert clock.direct_errors == 4 and refusing.cleared == 4
    # Nothing was left for torch's own launch checks to raise on.
    assert (src + 1).sum().item() == 21


def test_the_ring_reads_sampled_cycles_itself_as_the_events_beside_read():
    """With no sink wanting every cycle, the ring reads sampled cycles' GPU times itself
    (``set_native_events``, once the resolver's direct path was checked) and walks them with
    the GIL let go: the histograms' sums equal what the test's own events beside read."""
    torch.cuda.init()
    obs = specobs.configure(sinks=[], clock="cuda", sample_every=1,
                            poll_interval_seconds=0.001)
    x = torch.randn(1024, 1024, device="cuda")

    def cycles(n: int) -> list[list[object]]:
        mine = []
        for i in range(n):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            # Work queued ahead, so that no event of either side completes on an idle GPU (it
            # would time the host's moments between the two sides' records, not the GPU's).
            torch.cuda._sleep(1_000_000)  # ~0.5 ms, longer than any host delay in between
            # Each side's interval holds one record of the other's (an event record takes GPU
            # time too, a few percent of this draft): ev[0] before begin()'s event,
            # ev[1] before mark()'s.
            ev[0].record()
            with obs.cycle() as c:
                for _ in range(1 + i % 3):
                    x @ x
                ev[1].record()
                c.mark("verify")
                for _ in range(4):
                    x @ x
                ev[2].record()
                c.mark("bookkeeping")
            mine.append(ev)
            if i % 50 == 49:
                time.sleep(0.01)  # the resolver drains beside the loop
        torch.cuda.synchronize()
        assert obs.force_flush(timeout_seconds=30)
        return mine

    def sums() -> list[float]:
        s = obs.snapshot()
        return [s.phase_histograms[(p, "gpu")].sum for p in ("draft", "verify")]

    try:
        cycles(20)  # the first cycles start the clock and its direct path: host time inside
        before = sums()
        n = 400
        mine = cycles(n)
        after = sums()
        ring = obs._recorder.ring
        s = obs.snapshot()
        assert s.sampled_cycles_total == n + 20
        assert ring.native_gpu_cycles > n // 2
        if type(ring).__module__ == "specobs._core":  # the pure-Python ring holds the GIL
            assert ring.nogil_cycles > 0
        assert s.errors == dict.fromkeys(s.errors, 0)
        want = [sum(e[j].elapsed_time(e[j + 1]) for e in mine) / 1e3 for j in range(2)]
        assert after[1] - before[1] == pytest.approx(want[1], rel=0.01)
        assert after[0] - before[0] == pytest.approx(want[0], rel=0.01)
    finally:
        obs.shutdown(timeout_seconds=5)


def test_draft_lengths_with_cuda_acceptance_land_by_k_without_a_sync(cuda_obs):
    """A k schedule on the GPU: cycles that begin with their k (0 included) and hand CUDA
    acceptance, deferred ones settled later with per-row verified lengths; every cycle lands
    under its k, acceptance under each row's, and the hot path never synchronises."""
    obs, _ = cuda_obs
    torch.cuda._sleep(1000)
    rows = torch.tensor([2, 0, 1], device="cuda")
    torch.cuda.synchronize()
    schedule = [0, 0, 2, 3, 3]
    handles = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i, k in enumerate(schedule * 4):
            with obs.cycle(batch_size=3, draft_length=k) as c:
                torch.cuda._sleep(10_000)
                c.mark("verify")
                c.mark("bookkeeping")
                if k == 0:
                    c.accept([0, 0, 0], draft_length=0)
                elif i % 2:
                    c.accept(rows, draft_length=3)  # verified 3 (the previous step's k)
                else:
                    handles.append(c.defer())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for h in handles:
        h.settle(rows, draft_length=[3, 3, 3])
    assert obs.force_flush(timeout_seconds=30)
    s = obs.snapshot()
    assert s.cycles_by_draft_length == {0: 8, 2: 4, 3: 8}
    assert s.errors == dict.fromkeys(s.errors, 0)
    spec = 12  # the cycles of k 2 and 3, each verifying 3 drafts per row, accepting 2+0+1
    assert s.accepted_by_draft_length == {0: 0, 3: spec * 3}
    assert s.drafted_by_draft_length == {0: 0, 3: spec * 3 * 3}
    assert s.emitted_by_draft_length == {0: 8 * 3, 2: 4 * 6, 3: 8 * 6}
    assert s.phase_count("draft", "gpu") == 20
