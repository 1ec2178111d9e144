"""The native core's drain walks the common case with the GIL let go, while the worker keeps
recording: nothing counted twice, nothing lost, a full ring's drops counted exactly.

The worker here lets go of the GIL between cycles as an engine waiting on its GPU does
(``hashlib`` on 64 KiB), so the resolver's walks run beside it on another core."""

from __future__ import annotations

import hashlib

import pytest

import specobs
from specobs import _ring
from specobs._holds import Tuning

native_only = pytest.mark.skipif(not _ring.NATIVE, reason="the native core is not built here")

_WORK = bytes(1 << 16)


def host_cycles(obs: specobs.Observer, n: int, work: bytes = _WORK) -> None:
    """``n`` cycles of batch 8 accepting [1, 2, 0, 3, 4, 1, 0, 2] of 4 (13 of 32 tokens), the
    GIL let go every 4th as by an engine waiting on its GPU (hashing ``work``)."""
    acc = [1, 2, 0, 3, 4, 1, 0, 2]
    for i in range(n):
        with obs.cycle(batch_size=8) as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept(acc, draft_length=4)
        if i % 4 == 0:
            hashlib.sha256(work).digest()


def run(n: int, capacity: int) -> tuple[specobs.Snapshot, object]:
    obs = specobs.configure(sinks=[], poll_interval_seconds=0.001, queue_size=capacity)
    try:
        host_cycles(obs, n)
        assert obs.force_flush(30)
        return obs.snapshot(), obs._recorder.ring
    finally:
        obs.shutdown(5)


@native_only
def test_walks_beside_the_worker_count_every_cycle_once() -> None:
    n = 60_000
    s, ring = run(n, 1 << 15)
    assert s.dropped_total() == 0
    assert s.cycles_total == n
    assert s.accepted_tokens_total == 13 * n
    assert s.draft_tokens_total == 32 * n
    assert list(s.accept_length.counts[:5]) == [2 * n, 2 * n, 2 * n, n, n]
    assert ring.nogil_cycles > 0  # type: ignore[attr-defined]


@native_only
def test_a_full_ring_drops_beside_a_walk_are_counted_exactly() -> None:
    """A ring of 64 fills while walks take its tail: begin() drops the oldest under the ring's
    lock, so every cycle is either counted or dropped, never both, never neither."""
    n = 40_000
    s, ring = run(n, 64)
    dropped = s.dropped.get("queue_full", 0)
    assert s.cycles_total + dropped == n, (s.cycles_total, dropped)
    assert s.accepted_tokens_total == 13 * s.cycles_total
    assert sum(s.accept_length.counts) == 8 * s.cycles_total


class TraceSink(specobs.MemorySink):
    """Traces only: the cycles that are not traced are aggregated and never handed over (the
    native core walks them without the GIL)."""

    def __init__(self) -> None:
        super().__init__(max_cycles=1 << 20, traces=True)
        self.wants_cycles = False


@pytest.mark.parametrize("every_cycle", [False, True])
@pytest.mark.parametrize("chunk", [16, 100])
def test_every_cycle_picked_for_a_trace_is_traced_when_a_backlog_drains_in_chunks(
        chunk: int, every_cycle: bool) -> None:
    """With nothing held, the poll bounds a drain without walking the ring: no further than one
    chunk, or cycles the resolver picked for traces below the bound would be passed over by
    this chunk and never traced by the next (both rings; with the sink taking every cycle, and
    with traced cycles only)."""
    mem = specobs.MemorySink(traces=True) if every_cycle else TraceSink()
    obs = specobs.configure(sinks=[mem], poll_interval_seconds=3600, trace_head_rate=0.5,
                            queue_size=4096)
    rec = obs._recorder
    rec.wake = lambda: None  # type: ignore[method-assign]  # the test drains, not the thread
    rec.ring.wake_at = 1 << 30
    try:
        for _ in range(1000):
            with obs.cycle(batch_size=2) as c:
                c.mark("verify")
                c.mark("bookkeeping")
                c.accept([1, 2], draft_length=4)
        res = obs._resolver
        res.chunk = chunk
        res.tune(Tuning(slice_ns=1 << 40))  # chunks stay this size
        res.drain()
        traced = sorted(c.index for c in mem.cycles if c.trace_id is not None)
        assert obs.snapshot().cycles_total == 1000
        assert 350 < len(traced) < 650  # about half, at the head rate
        assert len(traced) == len(set(traced))
    finally:
        obs.shutdown(5)
