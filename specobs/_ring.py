"""The hot path's ring of cycle slots, in pure Python: the specification of ``specobs/_core/``.

Both implement the same two types with the same behaviour (tests/test_ring.py runs random
cycle streams through both and requires identical chunks and counters); :data:`Ring` is the
native one where it was built, this one elsewhere (no compiler at install time, another
interpreter, another OS). ``specobs_info{core}`` says which one runs.

**The worker's side.** ``Ring.begin(batch_size)`` takes the open slot, stamps it and returns a
:class:`Cycle` handle; ``Cycle.mark(phase)`` / ``accept(...)`` / ``end()`` write into that slot:
integer nanoseconds, the batch size, and the acceptance as per-sequence lengths with their sum
(lists, tuples, integer buffers such as numpy arrays, and whatever ``tolist()`` turns into a
list of ints in 0..k). Anything else is kept as the object, for the resolver to validate with
:mod:`specobs._acceptance` (a CUDA tensor: the recorder's copy in flight). What is rare goes to
the recorder (``slow``, :class:`specobs._recorder.Recorder`): misuse, which it counts and
logs; a sampled cycle's CUDA events (``slow.sample(t)``); a clock that may start
(``slow.try_clock(index)``); the queue running full (``queue_full``, ``wake``).

**Slots.** ``capacity`` ended cycles wait in ``[tail, head)``; the open cycle writes slot
``head``, never one still waiting. When a cycle ends in a full ring the oldest waiting one is
dropped and counted (``dropped_queue_full``), its events handed back through
:meth:`Ring.take_dropped`.

**Deferred acceptance.** ``Cycle.defer()`` ends a cycle whose acceptance is known only later
(state ``DEFERRED``: the drain stops at it as at an open slot); ``settle(...)``, from any
thread, gives the acceptance as ``accept`` takes it and hands the cycle on; the resolver's
``expire(timeout_ns)`` hands on, without tokens (``unsettled``), the ones nobody settled in
time, or with ``settle_backlog`` cycles waiting behind them.

**Handles.** The handle of the last ended cycle is kept and reused by the next ``begin`` only if
nobody else holds it (its reference count), so a steady loop creates no object per cycle and a
handle kept after ``end()`` stays closed: its calls are counted as misuse and never touch a
later cycle.

**The resolver's side.** ``pending(limit)`` lists the first ``limit`` waiting cycles that hold
events (the resolver asks the clock which completed) and the index bound of those ``limit``;
``drain(bound, limit, trace, slow_ns, want_all)`` consumes the waiting cycles below ``bound`` and
returns one chunk: host-clock histograms per phase and per cycle, the acceptance counted by
length, batch sizes bucketed, and *details* -- the few cycles that need Python (events, a copy,
values kept as objects, traced, or every cycle when a sink wants them all).

**Gaps between cycles.** The drain also measures, for each cycle, the host time since the end of
the previous cycle the same thread began (``begin`` keeps the thread's native id in the slot):
the engine's time outside cycles. The drain keeps the last end stamp of up to
:data:`GAP_THREADS` threads; a thread's first cycle has no gap, a gap longer than
``idle_gap_ns`` is counted as idle instead of observed, and a cycle the drain never sees
(dropped when the ring was full, discarded, begun in graph capture: a hole in the cycle
indices) makes every thread start afresh, so no gap spans it.

**Where it lives.** This module is the face: it names the twin's types and picks the ring in use.
The parts are :mod:`specobs._ring_slots` (a slot and how values are stored in it),
:mod:`specobs._ring_state` (the ring's slots, counters and locks), :mod:`specobs._ring_worker`
(``begin`` and the handle), :mod:`specobs._ring_drain` (the poll, the drain, the totals) and
:mod:`specobs._ring_results` (the named chunk, totals and details).
"""

from __future__ import annotations

import os
from typing import Any

from specobs._ring_drain import RingDrain, poll_pending
from specobs._ring_results import (
    ByDraftLength,
    Detail,
    Drained,
    RingTotals,
    add_counts,
    add_ns_by_k,
    add_stamps_by_k,
)
from specobs._ring_slots import GAP_THREADS
from specobs._ring_worker import PyCycle, RingWorker

__all__ = [
    "BUILT", "GAP_THREADS", "NATIVE", "ByDraftLength", "Cycle", "Detail", "Drained", "NativeRing",
    "PyCycle", "PyRing", "Ring", "RingTotals", "add_counts", "add_ns_by_k", "add_stamps_by_k",
    "poll_pending",
]


class PyRing(RingWorker, RingDrain):
    """See the module's docstring; the native core's ``Ring`` (``specobs/_core/``) is the same
    in C."""


try:
    from specobs._core import Cycle as _NativeCycle
    from specobs._core import Ring as _NativeRing
    from specobs._core import set_detail_type

    set_detail_type(Detail)

    #: Whether the native ring runs: built, and not switched off with ``SPECOBS_CORE=python``
    #: (read once, at import: for comparing the two and for running the suite on the twin).
    NATIVE = os.environ.get("SPECOBS_CORE", "").strip().lower() != "python"
except ImportError:  # not built (no compiler at install time, another interpreter or OS)
    NATIVE = False

#: Whether the native ring was built (whatever ``SPECOBS_CORE`` says).
BUILT = "_NativeRing" in globals()
#: The ring and handle types in use.
Ring: Any = _NativeRing if NATIVE else PyRing
Cycle: Any = _NativeCycle if NATIVE else PyCycle
#: The native types where built (for the differential test), else the twin's.
NativeRing: Any = _NativeRing if BUILT else PyRing
