"""The native core's drain walks the common case with the GIL let go, while the worker keeps
recording: nothing counted twice, nothing lost, a full ring's drops counted exactly.

The worker here lets go of the GIL between cycles as an engine waiting on its GPU does
(``hashlib`` on 64 KiB), so the resolver's walks run beside it on another core."""

from __future__ import annotations

import hashlib

import pytest

import specobs
from specobs import _ring

pytestmark = pytest.mark.skipif(not _ring.NATIVE, reason="the native core is not built here")

_WORK = bytes(1 << 16)


def run(n: int, capacity: int) -> tuple[specobs.Snapshot, object]:
    obs = specobs.configure(sinks=[], poll_interval_seconds=0.001, queue_size=capacity)
    acc = [1, 2, 0, 3, 4, 1, 0, 2]
    try:
        for i in range(n):
            with obs.cycle(batch_size=8) as c:
                c.mark("verify")
                c.mark("bookkeeping")
                c.accept(acc, draft_length=4)
            if i % 4 == 0:
                hashlib.sha256(_WORK).digest()  # the GIL let go, as a wait on the GPU
        assert obs.force_flush(30)
        return obs.snapshot(), obs._recorder.ring
    finally:
        obs.shutdown(5)


def test_walks_beside_the_worker_count_every_cycle_once() -> None:
    n = 60_000
    s, ring = run(n, 1 << 15)
    assert s.dropped_total() == 0
    assert s.cycles_total == n
    assert s.accepted_tokens_total == 13 * n
    assert s.draft_tokens_total == 32 * n
    assert list(s.accept_length.counts[:5]) == [2 * n, 2 * n, 2 * n, n, n]
    assert ring.nogil_cycles > 0  # type: ignore[attr-defined]


def test_a_full_ring_drops_beside_a_walk_are_counted_exactly() -> None:
    """A ring of 64 fills while walks take its tail: begin() drops the oldest under the ring's
    lock, so every cycle is either counted or dropped, never both, never neither."""
    n = 40_000
    s, ring = run(n, 64)
    dropped = s.dropped.get("queue_full", 0)
    assert s.cycles_total + dropped == n, (s.cycles_total, dropped)
    assert s.accepted_tokens_total == 13 * s.cycles_total
    assert sum(s.accept_length.counts) == 8 * s.cycles_total
