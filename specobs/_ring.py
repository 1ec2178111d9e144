"""The hot path's ring of cycle slots, in pure Python: the specification of ``specobs/_core.c``.

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
``expire(timeout_ns)`` hands on, without tokens (``unsettled``), the ones nobody settled.

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
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

from specobs import _bucketing
from specobs._signalsafe import GuardedLock

__all__ = ["NATIVE", "Cycle", "Detail", "Drained", "PyCycle", "PyRing", "Ring"]

#: Most sequences one accept() stores in the slot; more are validated by the resolver.
NATIVE_MAX_SEQ = 65536
NSPARES = 4
#: Recording threads whose last cycle the drain remembers for the gaps between cycles; a new
#: thread beyond them takes the place of the one whose last cycle ended first.
GAP_THREADS = 64
#: Gaps between a thread's cycles longer than this (ns) are idling, not observed: the default of
#: ``Settings.idle_gap_seconds``.
IDLE_GAP_NS = 1_000_000_000
MAX_BATCH = 1 << 31
MAX_PHASES = 16
_INT_FORMATS = frozenset("bBhHiIlLqQ")
_INT_ONLY = {int}
_perf = time.perf_counter_ns
#: Slot states: reserved by begin() (open), ended and waiting (done), or not a cycle (void:
#: discarded, begun in graph capture, drained). The resolver drains done slots in order, passes
#: void ones and stops at an open one.
OPEN, DONE, VOID = 1, 2, 3
#: A fourth: ended by ``defer()``, its times final and its acceptance to come from
#: ``settle()`` (then done), or from nobody within the resolver's timeout (``expire``: done,
#: counted ``unsettled``, its tokens not counted). The drain stops at it as at an open one.
DEFERRED = 4
#: A handle's deferral: none, awaiting ``settle()``, settled, or nothing to settle (the cycle was
#: discarded or begun in graph capture: counted there).
_NO_DEFER, _AWAITING, _SETTLED, _NOTHING = 0, 1, 2, 3
_getrefcount = getattr(sys, "getrefcount", None)

class Detail(NamedTuple):
    """A cycle the resolver finishes in Python, as a drain hands it over (both rings; the
    native one builds the same class, ``set_detail_type`` below)."""

    #: The cycle's index (``CycleHandle.index``).
    cycle_index: int
    #: Its host clock stamps (ns), one per phase boundary: phases + 1.
    stamps: list[int]
    #: ``batch_size`` as given when the ring did not take it (for the resolver's verdict), the
    #: one it took, or ``None``.
    batch: Any
    #: The sampled cycle's CUDA events, one per boundary (``None``: not sampled, or read by the
    #: ring already).
    events: Any
    #: What recording those events cost the worker (ns).
    cost_ns: int
    #: ``native``: the accepted lengths the ring stored (already in the chunk's totals); else
    #: the object the caller gave, or ``None``, for the resolver to validate.
    acceptance: Any
    #: ``native``: the draft length the ring stored; else as the caller gave it.
    draft_length: Any
    #: ``emitted`` as the caller gave it (``None``: accepted + 1 per sequence).
    emitted: Any
    #: A CUDA acceptance copy in flight (read by the resolver), or ``None``.
    copy: Any
    #: 1 when the ring stored the acceptance itself, 0 when the resolver validates it.
    native: int
    #: 1 when the cycle was picked for a trace.
    traced: int
    #: The cycle's draft length (the k in effect, ``begin(draft_length=)`` or else derived from
    #: ``accept``'s): ``>= 0``, the ring counted the cycle and its host phase times under it
    #: (its emitted tokens too when ``native``); -1, the cycle has none; -2, for the resolver:
    #: from ``cycle_k_obj`` when not ``None``, else from the acceptance it validates.
    cycle_k: int
    #: ``begin``'s ``draft_length`` as given, when the ring did not take it (not an int in
    #: 0..max_draft_length): for the resolver's verdict; else ``None``.
    cycle_k_obj: Any


#: What ``drain`` returns (``drain_into`` adds the columns to the running totals instead):
#: (cycles, host [(counts, sum ns)] per phase then the cycle, sum of cycle ns, last end stamp,
#: sequences per accepted length, accepted, drafted, emitted, {draft length: sequences},
#: batch sizes (counts, sum), batch sizes counted, details, copies read by the drain for the
#: resolver to hand back to their pool, the counts by draft length (:data:`ByDraftLength`),
#: the gaps between cycles (counts, sum ns) and the idle gaps counted).
Drained = tuple[
    int, list[tuple[list[int], int]], int, int | None, list[int], int, int, int,
    dict[int, int], tuple[list[int], int], int, list[Detail], list[Any], "ByDraftLength",
    tuple[list[int], int], int,
]
#: What a drain counts by draft length, only the lengths seen, keys sorted: ({cycle k: cycles},
#: {cycle k: host ns per phase}, {cycle k: emitted tokens}, {sequence k: accepted tokens},
#: {cycle k: sequences}: the batch sizes of those cycles, where counted).
ByDraftLength = tuple[
    dict[int, int], dict[int, list[int]], dict[int, int], dict[int, int], dict[int, int]]


def _columns(compiled: Any, reference: Any, *args: Any) -> Any:
    """``compiled(*args)``, or the reference's answer if it refused something."""
    try:
        return compiled(*args)
    except Exception:
        return reference(*args)


class _Slot:
    __slots__ = (
        "acc", "accsum", "ak", "batch", "batch_obj", "copy", "cost", "dk", "dk_obj", "draft",
        "emitted", "ev", "has_obj_acc", "idx", "k", "lens", "nseq", "state", "tid", "ts",
    )

    def __init__(self) -> None:
        self.ts: list[int] = []
        self.idx = 0
        #: The native id of the thread that began the cycle (its gap is to that thread's last).
        self.tid = 0
        self.cost = 0
        self.batch = -1
        self.accsum = 0
        self.k = 0
        self.nseq = -1
        self.lens: list[int] = []
        self.state = VOID
        self.ev: Any = None
        self.copy: Any = None
        self.acc: Any = None
        self.draft: Any = None
        self.emitted: Any = None
        self.batch_obj: Any = None
        self.has_obj_acc = False
        #: ``begin``'s draft length: an int in 0..k_max (-1: none or not taken), or the object
        #: as given for the resolver (``dk_obj``); ``accept``'s, when an int in 0..k_max (-1).
        self.dk = -1
        self.dk_obj: Any = None
        self.ak = -1

    def cycle_k(self) -> int:
        """The cycle's draft length as the ring knows it (see :attr:`Detail.cycle_k`): begin's,
        else the native acceptance's own when ``accept`` named it, else none (-1), or -2 when
        only the resolver can say (begin's object, or acceptance kept as an object)."""
        if self.dk_obj is not None:
            return -2
        if self.dk >= 0:
            return self.dk
        if self.nseq >= 0:
            return self.ak
        return -2 if self.has_obj_acc else -1

    def clear_objs(self, grave: list[Any] | None = None) -> None:
        """Let go of the objects kept; into ``grave`` when given, so that nothing a caller
        passed is freed (and no ``__del__`` runs) until the walk that clears it is over."""
        if grave is not None:
            grave += (self.acc, self.draft, self.emitted, self.batch_obj, self.ev, self.copy,
                      self.dk_obj)
        self.acc = self.draft = self.emitted = self.batch_obj = self.dk_obj = None


def add_stamps_by_k(into: dict[int, list[int]], k: int, stamps: Any, nph: int) -> None:
    """Add one cycle's host ns per phase (from its ``nph + 1`` stamps) under draft length
    ``k``: what the ring counts of the cycles it places, and the resolver of the others."""
    have = into.get(k)
    if have is None:
        have = into[k] = [0] * nph
    for i in range(nph):
        have[i] += stamps[i + 1] - stamps[i]


def add_ns_by_k(into: dict[int, list[int]], more: dict[int, list[int]]) -> None:
    """Add host ns per phase by draft length ``more`` into ``into`` (lists are not shared)."""
    for k, ns in more.items():
        have = into.get(k)
        into[k] = list(ns) if have is None else [a + b for a, b in zip(have, ns, strict=True)]


def add_counts(into: dict[int, int], more: dict[int, int]) -> None:
    """Add counts by key ``more`` into ``into``."""
    for k, n in more.items():
        into[k] = into.get(k, 0) + n


def _exact_int_in(o: Any, lo: int, hi: int) -> int | None:
    if type(o) is int and lo <= o <= hi:
        return o
    return None


def _set_batch(s: _Slot, b: Any) -> None:
    v = _exact_int_in(b, 0, MAX_BATCH)
    if v is not None:
        s.batch = v
        s.batch_obj = None
    else:
        s.batch = -1
        s.batch_obj = b


def _set_draft_length(s: _Slot, k: Any, k_max: int) -> None:
    """``begin``'s draft length: taken when an exact int in 0..k_max, else kept for the
    resolver (a numpy / torch scalar, or a bad value it counts as ``bad_draft_length``)."""
    v = _exact_int_in(k, 0, k_max)
    if v is not None:
        s.dk = v
        s.dk_obj = None
    else:
        s.dk = -1
        s.dk_obj = k


def _store_lengths(s: _Slot, seq: list[int] | tuple[int, ...], k: int) -> bool:
    """Store exact ints in 0..k (checked with C-level builtins: no Python work per value)."""
    n = len(seq)
    if n > NATIVE_MAX_SEQ:
        return False
    if n and (set(map(type, seq)) != _INT_ONLY or min(seq) < 0 or max(seq) > k):
        return False
    s.lens = list(seq)
    s.nseq = n
    s.k = k
    s.accsum = sum(seq)
    return True


def _store_buffer(s: _Slot, obj: Any, k: int) -> bool:
    if isinstance(obj, (bytes, bytearray)):
        return False
    try:
        view = memoryview(obj)
    except TypeError:
        return False
    try:
        fmt = view.format.lstrip("@=<")
        if (view.ndim != 1 or len(fmt) != 1 or fmt not in _INT_FORMATS
                or not view.contiguous or len(view) > NATIVE_MAX_SEQ):
            return False
        values = view.tolist()
    finally:
        view.release()
    return _store_lengths(s, values, k)


#: Every pure-Python ring, for the fork handler below.
_RINGS: weakref.WeakSet[PyRing] = weakref.WeakSet()


def _new_locks_in_child() -> None:
    """After fork: the child has only the forking thread, so a lock another thread held at the
    fork would never be released; each ring gets new ones (the native core does the same with
    its generation counter)."""
    for ring in list(_RINGS):
        ring._lock = GuardedLock()
        ring._hot = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)


def _serialized(method: Any) -> Any:
    """The method under its ring's hot-path lock. A native call is one step under the GIL;
    Python code is not, and threads sharing an observer (misuse, counted, but never corrupting
    counts) would otherwise interleave inside a call at any bytecode.

    A call made while this very thread is inside one (a signal handler that interrupted it, or
    a callback into the engine's code) finds that call half done: it is refused and counted as
    ``errors{kind="signal_reentry"}`` (``begin`` returns the no-op handle). The methods that
    call one another call the undecorated method (``__wrapped__``)."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        ring = self if isinstance(self, PyRing) else self._ring
        hot = ring._hot
        if hot._is_owned():  # type: ignore[union-attr]  # the C RLock has it
            ring._misuse("signal_reentry", f"{name}() called while this thread was inside "
                         "another call of the same observer (a signal handler?); refused")
            return ring.null_cycle if name == "begin" else self if name == "defer" else None
        with hot:
            return method(self, *args, **kwargs)

    return call


class RingTotals(NamedTuple):
    """The running totals :meth:`PyRing.drain_into` (and the native ring's walk) keep of the
    cycles they count without Python: what ``totals()`` returns, by name. A histogram is
    ``(counts per bucket, raw sum)`` (durations in the clock's ns); the per-phase ones list the
    phases, then the whole cycle."""

    cycles: int
    #: Host-clock durations, per phase then the cycle.
    host: list[_bucketing.Bucketed]
    #: Sequences per accepted length 0..k_max.
    sequences_by_accepted: list[int]
    accepted: int
    drafted: int
    emitted: int
    #: Sequences per draft length (only the lengths seen).
    sequences_by_draft_length: dict[int, int]
    #: Batch sizes: (counts per bucket, sum).
    batch: _bucketing.Bucketed
    #: Cycles whose batch size was counted.
    batches: int
    #: The last counted cycle's end stamp (the ring's clock, ns), or None.
    last_end_ns: int | None
    #: GPU-clock durations of the sampled cycles the ring read itself, per phase then the cycle.
    gpu: list[_bucketing.Bucketed]
    #: Cycles by their draft length (the k in effect; see :attr:`Detail.cycle_k`), only the
    #: lengths seen: the ones the ring could tell (the resolver adds the others).
    cycles_by_draft_length: dict[int, int]
    #: Host-clock ns per phase of those cycles, by the cycle's draft length.
    host_ns_by_draft_length: dict[int, list[int]]
    #: Tokens those cycles emitted (their acceptance counted here), by the cycle's draft length.
    emitted_by_draft_length: dict[int, int]
    #: Accepted tokens by each sequence's own draft length (the drafts it verified).
    accepted_by_draft_length: dict[int, int]
    #: Sequences (the batch sizes the ring counted) of the cycles it placed, by their draft
    #: length; every length of ``cycles_by_draft_length``, 0 where none had a batch size.
    batch_by_draft_length: dict[int, int]
    #: Host-clock gaps between a thread's cycles (counts on the duration bounds, sum ns), and the
    #: gaps longer than ``idle_gap_ns`` counted instead.
    gap: _bucketing.Bucketed
    idle_gaps: int


class PyCycle:
    """One speculative decoding cycle in flight. Created by :meth:`Observer.begin`; also a
    context manager (``with observer.cycle() as c: ...`` ends the cycle on exit)."""

    __slots__ = ("_closed", "_pos", "_ring", "_seq", "_settle", "index")

    def __init__(self, ring: PyRing, index: int, pos: int) -> None:
        self._ring = ring
        self.index = index
        self._seq = index
        self._pos = pos
        self._closed = 0
        self._settle = _NO_DEFER

    def _slot(self) -> _Slot:
        slots = self._ring._slots
        return slots[self._pos % len(slots)]

    def _owns(self, s: _Slot) -> bool:
        """Whether the slot is still this cycle's and open (a call into Python may let another
        thread close this cycle meanwhile: misuse, an observer is one thread's)."""
        return s.state == OPEN and s.idx == self._seq

    @_serialized
    def mark(self, phase: str, /) -> None:
        """End the running phase and start ``phase`` (the next one in the configured order)."""
        r = self._ring
        t = r._now()
        if self._closed:
            r._call(r.slow.misuse_mark, True, phase, None)
            return
        slots = r._slots
        s = slots[self._pos % len(slots)]
        i = len(s.ts)
        try:
            ok = i < r.nph and (r.phases[i] is phase or r.phases[i] == phase)
        except Exception as exc:
            r._internal(exc)
            return
        if ok and (self._closed or not self._owns(s) or len(s.ts) != i):
            return  # closed meanwhile by another thread's begin (counted there)
        if not ok:
            r._call(r.slow.misuse_mark, False, phase, i)
            return
        s.ts.append(t)
        if s.ev is not None:
            r._record(s, i, t)

    @_serialized
    def accept(
        self,
        accepted: Any,
        *,
        draft_length: Any = None,
        batch_size: Any = None,
        emitted: Any = None,
    ) -> None:
        """Record acceptance for this cycle (see :meth:`specobs.CycleHandle.accept`)."""
        r = self._ring
        if self._closed:
            r._misuse("bad_acceptance", "accept() after the cycle ended")
            return
        s = self._slot()
        if not self._owns(s):
            return
        if batch_size is not None:
            _set_batch(s, batch_size)
        s.nseq = -1
        s.has_obj_acc = False
        s.acc = s.draft = s.emitted = None
        if s.copy is not None:
            r.dropped.append((None, s.copy))
            s.copy = None
        k: int | None = r.k_max if draft_length is None else _exact_int_in(
            draft_length, 0, r.k_max)
        s.ak = -1 if draft_length is None or k is None else k
        values: Any = None
        seq: Any = None
        try:
            if type(accepted) is list or type(accepted) is tuple:
                seq = accepted
            else:
                if k is not None and emitted is None and _store_buffer(s, accepted, k):
                    return
                try:
                    cuda = bool(getattr(accepted, "is_cuda", False))
                except Exception:
                    cuda = False
                if not self._owns(s) or self._closed:
                    return
                if cuda:
                    s.draft = draft_length
                    s.emitted = emitted
                    r._accept_cuda(self, s, accepted)
                    return
                tolist = getattr(accepted, "tolist", None)
                if tolist is not None:
                    values = tolist()
                    if not self._owns(s) or self._closed:
                        return
                    if type(values) is list:
                        seq = values
            if seq is not None and k is not None and emitted is None:
                if _store_lengths(s, seq, k):
                    return
            if values is not None:
                keep = values
            elif seq is not None:
                keep = list(seq)
            else:
                keep = accepted
        except Exception as exc:
            r._internal(exc)
            return
        s.acc = keep
        s.has_obj_acc = True
        s.draft = draft_length
        s.emitted = emitted

    @_serialized
    def end(self) -> None:
        """End the last phase and hand the cycle to the resolver."""
        r = self._ring
        t = r._now()
        if self._closed:
            r._misuse("end_without_begin", "end() on a cycle that already ended")
            return
        self._closed = 1
        if r.current is self:
            r._close_current()
        slots = r._slots
        s = slots[self._pos % len(slots)]
        if s.state != OPEN or s.idx != self._seq:
            return  # discarded already (and counted)
        if self.index < 0:
            s.state = VOID  # begun in CUDA graph capture: counted when it began
            return
        if len(s.ts) != r.nph:
            r._discard(s)
            r._call(r.slow.misuse_end, len(s.ts))
            return
        s.ts.append(t)
        if s.ev is not None:
            r._record(s, r.nph, t)
        if s.state != OPEN or s.idx != self._seq:
            return  # dropped while the event was recorded (counted there)
        if self._settle == _AWAITING:
            s.state = DEFERRED  # defer(): handed on by settle() or expire()
            r.deferred += 1
            return
        s.state = DONE
        r.enqueued += 1
        r._waiting += 1
        if s.ev is not None or s.copy is not None:
            r.held_cycles += 1
        if r._waiting >= r.wake_at:
            r._call(r.slow.wake)

    @_serialized
    def defer(self) -> PyCycle:
        """End the cycle with its acceptance still to come: its phase times are final now, its
        acceptance is given later by :meth:`settle` (from any thread), and the resolver holds
        the cycle until then, or until its timeout (``unsettled``: the times counted, the
        tokens not). Returns this handle: keep it for :meth:`settle`."""
        if self._closed:
            self._ring._misuse("end_without_begin", "defer() on a cycle that already ended")
            return self
        self._settle = _AWAITING
        PyCycle.end.__wrapped__(self)  # the lock is held
        s = self._slot()
        if s.state != DEFERRED or s.idx != self._seq:
            self._settle = _NOTHING  # discarded (counted there) or begun in graph capture
        return self

    @_serialized
    def settle(
        self,
        accepted: Any,
        *,
        draft_length: Any = None,
        batch_size: Any = None,
        emitted: Any = None,
    ) -> None:
        """Give a deferred cycle its acceptance (as :meth:`accept` takes it; ``None``: count no
        tokens and no batch) and hand the cycle to the resolver. Twice, without ``defer()``, or
        after the timeout: counted (``errors{kind="bad_settle"}``), never raised."""
        r = self._ring
        st = self._settle
        if st == _NOTHING:
            return
        if st != _AWAITING:
            r._misuse("bad_settle", "settle() twice on one cycle" if st == _SETTLED
                      else "settle() on a cycle that was not deferred")
            return
        self._settle = _SETTLED
        s = self._slot()
        if s.state != DEFERRED or s.idx != self._seq:
            r._misuse("bad_settle", "settle() after the cycle's timeout (counted unsettled) or "
                      "after it was dropped")
            return
        r.deferred -= 1
        # Open again for accept() only: nothing but settle() holds this handle's slot, and the
        # drain stops at an open slot as at a deferred one.
        s.state = OPEN
        self._closed = 0
        try:
            if accepted is None:
                r._clear_acceptance(s)
            else:
                PyCycle.accept.__wrapped__(  # the lock is held
                    self, accepted, draft_length=draft_length, batch_size=batch_size,
                    emitted=emitted)
        finally:
            self._closed = 1
        if not self._owns(s):
            return  # dropped by a full ring meanwhile (counted there)
        r._hand_on(s)

    def __enter__(self) -> PyCycle:
        return self

    @_serialized
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            # The engine raised mid-cycle: the phase times are meaningless, discard quietly
            # (counted under a reason of its own, not as misuse).
            if not self._closed:
                r = self._ring
                self._closed = 1
                if r.current is self:
                    r._close_current()
                s = self._slot()
                if self._owns(s):
                    r.excepted += 1
                    r._void(s)
            return
        if not self._closed:
            PyCycle.end.__wrapped__(self)  # the lock is held


class PyRing:
    """See the module's docstring; ``specobs/_core.c``'s ``Ring`` is the same in C."""

    def __init__(
        self,
        slow: Any,
        phases: tuple[str, ...],
        capacity: int,
        max_draft_length: int,
        wake_at: int,
        duration_bounds: Sequence[float],
        batch_bounds: Sequence[float],
        null_cycle: Any,
    ) -> None:
        if not 1 <= len(phases) <= MAX_PHASES:
            raise ValueError(f"between 1 and {MAX_PHASES} phases, got {len(phases)}")
        if capacity < 1 or not 0 <= max_draft_length <= 255:
            raise ValueError("capacity >= 1 and 0 <= max_draft_length <= 255")
        self.slow = slow
        self.phases = tuple(phases)
        self.nph = len(phases)
        self.capacity = capacity
        self._slots = [_Slot() for _ in range(capacity + 1)]
        self._head = 0
        self._tail = 0
        self.k_max = max_draft_length
        self.wake_at = wake_at
        self._db = list(map(float, duration_bounds))
        self._bb = list(map(float, batch_bounds))
        for b in (self._db, self._bb):
            if any(not y > x for x, y in itertools.pairwise(b)):
                raise ValueError("bounds must be strictly increasing")
        self.null_cycle = null_cycle
        self.enabled = 1
        self.sampling = 0
        self.interval = 1
        self.clock_try_at = -1
        self.begun = 0
        #: The native id of the thread that began the last cycle (0: none yet).
        self.writer = 0
        #: Gaps between a thread's cycles longer than this (ns) are counted as idle, not
        #: observed (``Settings.idle_gap_seconds``).
        self.idle_gap_ns = IDLE_GAP_NS
        self.enqueued = 0
        #: Cycles ended by defer() awaiting settle(); cycles the timeout handed on unsettled.
        self.deferred = 0
        self.unsettled = 0
        self.dropped_queue_full = 0
        self.discarded = 0
        #: Cycles discarded because the engine raised inside ``with`` (not misuse).
        self.excepted = 0
        self.copy_ns = 0
        #: The native core drains the common case with the GIL let go (``nogil_*``: cycles, walks,
        #: thread CPU ns); Python cannot, so these stay 0 here.
        self.nogil_cycles = self.nogil_walks = self.nogil_ns = 0
        self.walk_cpu_out = self.walk_cpu_in = self.walk_hold_ns = self.walk_count = 0
        #: Sampled cycles' GPU times read here through the runtime (``set_native_events``): the
        #: function, the thread it reads on, the cycles read so and their events' record cost.
        self._ne_elapsed: Any = None
        self._ne_lasterr: Any = None
        self._ne_thread = 0
        self.native_gpu_cycles = self.native_gpu_cost = 0
        #: Waiting cycles that hold events or a copy: with none, the poll has nothing to ask.
        self.held_cycles = 0
        self.record_fn: Any = None
        self.stream: Any = None
        #: The clock's pinned-buffer copy type, whose completed copies the drain reads itself.
        self.copy_type: Any = None
        # The poll's memory: the cycle whose copy it found first in flight, for how many polls.
        self.in_flight_index = -1
        self.in_flight_polls = 0
        self._waiting = 0
        self._lock = GuardedLock()  # never waited for by its holder (a signal handler)
        #: Held by the hot path's calls (``_serialized``): one at a time, as the native core's
        #: are under the GIL.
        self._hot = threading.RLock()
        _RINGS.add(self)  # both locks made anew in a forked child (a lost thread may hold one)
        #: Tests: a clock advancing ``tick`` ns per read instead of ``perf_counter_ns`` (0).
        self._now: Any = _perf
        self._tick = 0
        self._fake_now = 0
        #: The open cycle, or None: read by the recorder, written only here (in C, a getter).
        self.current: PyCycle | None = None
        #: Closed handles kept for reuse (see ``close_current`` in specobs/_core.c).
        self._spares: list[PyCycle | None] = [None] * NSPARES
        self.dropped: list[tuple[Any, Any]] = []
        #: Cycles :meth:`drain_into` has taken (the aggregation's generation moves with it).
        self.drained = 0
        #: The gaps' memory (set by :meth:`reset_totals`): the last end stamp of each recording
        #: thread seen (two lists, as the native core's arrays), and the index the next drained
        #: cycle has when none was lost in between (-1: none drained yet).
        self._gap_tids: list[int] = []
        self._gap_ends: list[int] = []
        self._gap_next = -1
        self.reset_totals()

    # -- helpers ---------------------------------------------------------------------------------
    @property
    def tick(self) -> int:
        return self._tick

    @tick.setter
    def tick(self, value: int) -> None:
        self._tick = int(value)
        if not self._tick:
            self._now = _perf
            return

        def counting() -> int:
            self._fake_now += self._tick
            return self._fake_now

        self._now = counting

    def _internal(self, exc: BaseException) -> None:
        try:
            self.slow.internal_error(exc)
        except Exception:
            pass

    def _call(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._internal(exc)

    def _misuse(self, kind: str, message: str) -> None:
        self._call(self.slow.misuse, kind, message)

    def _record(self, s: _Slot, i: int, t: int) -> None:
        try:
            self.record_fn(s.ev[i], self.stream)
            s.cost += self._now() - t
        except Exception as exc:
            self._internal(exc)

    def _drop_held(self, s: _Slot) -> None:
        if s.ev is None and s.copy is None:
            return
        self.dropped.append((s.ev, s.copy))
        s.ev = s.copy = None

    def _clear_acceptance(self, s: _Slot) -> None:
        """No tokens and no batch size for this cycle (its times stay, and begin's draft
        length)."""
        s.nseq = -1
        s.ak = -1
        s.has_obj_acc = False
        s.batch = -1
        s.acc = s.draft = s.emitted = s.batch_obj = None
        if s.copy is not None:
            self.dropped.append((None, s.copy))
            s.copy = None

    def _hand_on(self, s: _Slot, wake: bool = True) -> None:
        """A deferred cycle is done: the resolver may take it (woken by the worker's side)."""
        s.state = DONE
        self.enqueued += 1
        self._waiting += 1
        if s.ev is not None or s.copy is not None:
            self.held_cycles += 1
        if wake and self._waiting >= self.wake_at:
            self._call(self.slow.wake)

    def _void(self, s: _Slot) -> None:
        s.state = VOID
        self._drop_held(s)

    def _discard(self, s: _Slot) -> None:
        """A cycle called out of order: counted as misuse."""
        self.discarded += 1
        self._void(s)

    def _close_current(self) -> None:
        cur = self.current
        self.current = None
        if cur is None:
            return
        spares = self._spares
        at = NSPARES - 1
        for i in range(NSPARES):
            # Held by the list and getrefcount's argument only: free for reuse.
            if spares[i] is None or _getrefcount is None or _getrefcount(spares[i]) > 2:
                at = i
                break
        spares[at] = cur

    def _take_spare(self) -> PyCycle | None:
        spares = self._spares
        if _getrefcount is None:
            return None
        for i in range(NSPARES):
            if spares[i] is not None and _getrefcount(spares[i]) == 2:
                c = spares[i]
                spares[i] = None
                return c
        return None

    def _make_room(self, grave: list[Any]) -> bool:
        """Drop the oldest slots while the ring holds ``capacity``; whether a done cycle was
        dropped (see ``make_room`` in specobs/_core.c)."""
        dropped = False
        slots = self._slots
        while self._head - self._tail >= self.capacity:
            old = slots[self._tail % len(slots)]
            if old.state == DONE:
                self.dropped_queue_full += 1
                self._waiting -= 1
                self.held_cycles -= old.ev is not None or old.copy is not None
                dropped = True
            elif old.state == OPEN:
                self.dropped_queue_full += 1
            elif old.state == DEFERRED:
                self.dropped_queue_full += 1
                self.deferred -= 1
            old.state = VOID
            self._drop_held(old)
            old.clear_objs(grave)
            self._tail += 1
        return dropped

    def _accept_cuda(self, c: PyCycle, s: _Slot, tensor: Any) -> None:
        t = self._now()
        try:
            copy = self.slow.copy_to_host(tensor)
        except Exception as exc:
            self.copy_ns += self._now() - t
            self._internal(exc)
            return
        self.copy_ns += self._now() - t
        if not c._owns(s) or c._closed:
            if copy is not None:
                self.dropped.append((None, copy))
            return
        if copy is None:
            if s.batch < 0 and s.batch_obj is None:
                try:
                    n = tensor.numel()
                except Exception:
                    n = None
                v = _exact_int_in(n, 0, MAX_BATCH)
                if v is not None:
                    s.batch = v
            return
        s.copy = copy
        s.has_obj_acc = True

    # -- the worker's side -----------------------------------------------------------------------
    @_serialized
    def begin(self, batch_size: Any = None, draft_length: Any = None) -> Any:
        """Start a cycle (and its first phase); returns its handle. ``draft_length``: the k
        the engine scheduled for this cycle's draft phase (0: a step that drafts nothing)."""
        t = self._now()
        if not self.enabled:
            return self.null_cycle
        self.writer = threading.get_native_id()
        was_open = False
        cur = self.current
        if cur is not None:
            cur._closed = 1
            old = cur._slot()
            if cur._owns(old):
                self._discard(old)
            self._close_current()
            was_open = True
        full = False
        if self._head - self._tail >= self.capacity:
            grave: list[Any] = []
            with self._lock:  # the resolver's drain walks the tail: not at the same time
                full = self._make_room(grave)
            del grave
        slots = self._slots
        pos = self._head
        s = slots[pos % len(slots)]
        # Made ready before the head moves past it: a drain stops at the head.
        s.clear_objs()
        s.ev = s.copy = None
        s.state = OPEN
        s.ts = [t]
        s.tid = self.writer
        s.nseq = -1
        s.has_obj_acc = False
        s.batch = -1
        s.cost = 0
        s.dk = s.ak = -1
        idx = self.begun
        self.begun = idx + 1
        s.idx = idx
        self._head = pos + 1
        if batch_size is not None:
            _set_batch(s, batch_size)
        if draft_length is not None:
            _set_draft_length(s, draft_length, self.k_max)
        spare = self._take_spare()
        if spare is not None:
            c = spare
            c.index = c._seq = idx
            c._pos = pos
            c._closed = 0
            c._settle = _NO_DEFER
        else:
            c = PyCycle(self, idx, pos)
        self.current = c
        if was_open:
            self._misuse("begin_while_open", "begin() while the previous cycle was open; the "
                         "open cycle was discarded (an observer belongs to one engine thread: "
                         "configure one per thread)")
        if full:
            self._call(self.slow.queue_full)
        if not self.sampling and self.clock_try_at >= 0 and idx >= self.clock_try_at:
            self._call(self.slow.try_clock, idx)
        if self.sampling and idx % (self.interval if self.interval > 0 else 1) == 0:
            try:
                ev = self.slow.sample(t)
            except Exception as exc:
                self._internal(exc)
                ev = None
            if not c._owns(s) or c._closed:
                if type(ev) is list:
                    self.dropped.append((ev, None))
            elif ev is False:
                c.index = -1
            elif type(ev) is list and len(ev) == self.nph + 1:
                s.ev = ev
                s.cost = self._now() - t
        return c

    # -- the resolver's side ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self._waiting

    def queued(self) -> int:
        return self._waiting

    def pending(self, limit: int) -> tuple[list[tuple[int, Any, Any]], int]:
        held: list[tuple[int, Any, Any]] = []
        bound = n = 0
        slots = self._slots
        ns = len(slots)
        for p in range(self._tail, self._head):
            if n >= limit:
                break
            s = slots[p % ns]
            if s.state == VOID:
                continue
            if s.state != DONE:
                break
            n += 1
            bound = s.idx + 1
            if s.ev is not None or s.copy is not None:
                held.append((s.idx, s.ev, s.copy))
        return held, bound

    def poll(self, limit: int, query: Any, polls_before_query: int) -> int:
        """Stage 1 of the resolver, the poll, when every event and copy was recorded on one
        stream: the index bound below which the first ``limit`` waiting cycles completed on the
        GPU (events complete in the order they were recorded there). ``query(event)`` is the
        clock's (None: no clock, nothing to wait for). See :func:`poll_pending`.

        With no waiting cycle holding events or a copy, every done cycle is complete: the bound
        is then the open cycle's index (the one cycle that may end, with events, before the
        drain), or the next index, but no further than ``limit`` slots from the tail: found
        without walking the ring."""
        if self.held_cycles == 0:
            cur = self.current
            open_ = cur._seq if cur is not None and cur._owns(cur._slot()) else self.begun
            # No further than the first ``limit`` slots (what one chunk drains; the resolver
            # picks traced cycles below the bound once). Positions and indices move together.
            first = self._tail + (self.begun - self._head)
            return int(min(open_, first + limit))
        held, bound = self.pending(limit)
        memory = [self.in_flight_index, self.in_flight_polls]
        out = poll_pending(held, bound, query, polls_before_query, memory)
        self.in_flight_index, self.in_flight_polls = memory
        return out

    def set_native_events(self, elapsed: int = 0, get_last_error: int = 0, query: int = 0
                          ) -> None:
        """Read sampled cycles' GPU times in :meth:`drain_into` through these runtime functions
        (``cudaEventElapsedTime``, ``cudaGetLastError``, by address), on the calling thread
        only; 0: turn it off. ``query`` (``cudaEventQuery``) is what the native core's poll asks
        events with; this poll asks the clock's ``query``, which calls the same function."""
        if not elapsed:
            self._ne_elapsed = None
            return
        self._ne_elapsed = ctypes.CFUNCTYPE(
            ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p
        )(elapsed)
        self._ne_lasterr = (
            ctypes.CFUNCTYPE(ctypes.c_int)(get_last_error) if get_last_error else None)
        self._ne_thread = threading.get_ident()

    def _read_gpu(self, ev: Any) -> list[int] | None:
        """A sampled cycle's GPU phase times through the runtime (see ``read_gpu`` in
        specobs/_core.c): ms as a float, rounded half to even to ns; None when a handle cannot
        be read, the runtime refuses, or a time is negative."""
        nph = self.nph
        try:
            if type(ev) is not list or len(ev) != nph + 1:
                return None
            h = [int(e.cuda_event) for e in ev]
        except Exception:
            return None
        if not all(h):
            return None
        ms = ctypes.c_float()
        out = []
        for i in range(nph):
            if self._ne_elapsed(ctypes.byref(ms), h[i], h[i + 1]) != 0:
                if self._ne_lasterr is not None:
                    self._ne_lasterr()
                return None
            ns = round(ms.value * 1e6)
            if not 0 <= ns < 9_000_000_000_000_000_000:
                return None
            out.append(ns)
        return out

    def drain(
        self, bound: int, limit: int, trace: list[int], slow_ns: int, want_all: bool
    ) -> Drained:
        return self._drain_locked(bound, limit, trace, slow_ns, want_all, None)

    def _drain_locked(
        self, bound: int, limit: int, trace: list[int], slow_ns: int, want_all: bool,
        gpu: list[list[int]] | None,
    ) -> Drained:
        if type(trace) is not list:
            raise TypeError("trace must be a list of cycle indices")
        # Python code can switch threads anywhere: the worker's drop of the oldest slots
        # (``_make_room``) waits for the walk (the native ring needs no lock: no Python code
        # runs inside its walk, see ``drop_ref`` in specobs/_core.c).
        grave: list[Any] = []
        with self._lock:
            out = self._drain(bound, limit, trace, slow_ns, want_all, grave, gpu)
        del grave  # what callers passed is freed here, outside the walk and the lock
        return out

    def _drain(
        self, bound: int, limit: int, trace: list[int], slow_ns: int, want_all: bool,
        grave: list[Any], gpu: list[list[int]] | None,
    ) -> Drained:
        """``gpu``: drain_into on the thread the runtime reads on (``set_native_events``):
        sampled cycles that need Python for nothing else have their GPU times read here,
        appended to it (the phases, then the cycle), and their events handed back in
        ``released``."""
        nph = self.nph
        w = self.k_max + 1
        tss: list[list[int]] = []
        lens: list[list[int]] = []
        batches: list[int] = []
        kseq: dict[int, int] = {}
        kcyc: dict[int, int] = {}
        khost: dict[int, list[int]] = {}
        kem: dict[int, int] = {}
        kacc: dict[int, int] = {}
        kbat: dict[int, int] = {}
        gaps: list[int] = []
        idle = 0
        accepted = drafted = emitted = 0
        n = ti = 0
        nt = len(trace)
        details: list[Detail] = []
        released: list[Any] = []
        slots = self._slots
        ns = len(slots)
        copy_type = self.copy_type
        while self._tail != self._head and n < limit:
            s = slots[self._tail % ns]
            if s.state == VOID:
                self._drop_held(s)
                s.clear_objs(grave)
                self._tail += 1
                continue
            if s.state != DONE or s.idx >= bound:
                break
            self.held_cycles -= s.ev is not None or s.copy is not None
            ts = s.ts
            tss.append(ts)
            idle += self._gap(s, gaps)
            if (s.copy is not None and s.nseq < 0 and s.acc is None and copy_type is not None
                    and type(s.copy) is copy_type):
                self._read_copy(s, released)
            nseq = s.nseq
            if nseq >= 0:
                if s.k > 0:  # a sequence that drafted nothing has no accept length
                    lens.append(s.lens)
                accepted += s.accsum
                drafted += s.k * nseq
                emitted += s.accsum + nseq
                kseq[s.k] = kseq.get(s.k, 0) + nseq
                kacc[s.k] = kacc.get(s.k, 0) + s.accsum
            ck = s.cycle_k()
            if ck >= 0:
                kcyc[ck] = kcyc.get(ck, 0) + 1
                add_stamps_by_k(khost, ck, ts, nph)
                kem[ck] = kem.get(ck, 0) + (s.accsum + nseq if nseq >= 0 else 0)
            py_batch = s.batch_obj is not None or s.has_obj_acc
            b = -1
            if not py_batch:
                b = s.batch if s.batch >= 0 else nseq
                if b >= 0:
                    batches.append(b)
            if ck >= 0:  # the resolver adds the batch sizes it validates
                kbat[ck] = kbat.get(ck, 0) + max(b, 0)
            traced = 0
            while ti < nt:
                want = trace[ti]
                if want > s.idx:
                    break
                ti += 1
                if want == s.idx:
                    traced = 1
            if slow_ns >= 0 and s.ev is None and ts[nph] - ts[0] >= slow_ns:
                traced = 1
            gpu_read = False
            if (gpu is not None and s.ev is not None and not want_all and not traced
                    and not py_batch and s.copy is None and s.acc is None
                    and s.emitted is None and s.dk_obj is None):
                g = self._read_gpu(s.ev)
                if g is not None and not (slow_ns >= 0 and sum(g) >= slow_ns):
                    gpu.append([*g, sum(g)])
                    released.append(s.ev)
                    self.native_gpu_cycles += 1
                    self.native_gpu_cost += s.cost
                    gpu_read = True
            if (want_all or traced or py_batch or (s.ev is not None and not gpu_read)
                    or s.copy is not None or s.acc is not None or s.emitted is not None
                    or s.dk_obj is not None):
                native = nseq >= 0
                batch = s.batch_obj if s.batch_obj is not None else (
                    s.batch if s.batch >= 0 else None)
                details.append(Detail(
                    s.idx, list(ts), batch, s.ev, s.cost,
                    list(s.lens) if native else s.acc,
                    s.k if native else s.draft,
                    s.emitted, s.copy, int(native), traced, ck, s.dk_obj,
                ))
            s.clear_objs(grave)
            s.ev = s.copy = None
            s.state = VOID
            self._tail += 1
            self._waiting -= 1
            n += 1
        # By columns, with the resolver's bucketing (compiled where built; the same answers).
        if tss:
            hl, total = _columns(_bucketing.host_chunk, _bucketing.host_chunk_py,
                                 tss, nph, self._db)
        else:
            hl, total = [([0] * (len(self._db) + 1), 0) for _ in range(nph + 1)], 0
        lcounts = (_columns(_bucketing.count_lengths, _bucketing.count_lengths_py,
                            lens, self.k_max, w) if lens else [0] * w)
        bucketed = _columns(_bucketing.bucket, _bucketing.bucket_py, batches, self._bb, 1.0)
        gapped = _columns(_bucketing.bucket, _bucketing.bucket_py, gaps, self._db, 1e-9)
        return (n, [(list(c), int(t)) for c, t in hl], total, tss[-1][nph] if tss else None,
                list(lcounts), accepted, drafted, emitted, {k: kseq[k] for k in sorted(kseq)},
                (list(bucketed[0]), bucketed[1]), len(batches), details, released,
                ({k: kcyc[k] for k in sorted(kcyc)}, {k: khost[k] for k in sorted(khost)},
                 {k: kem[k] for k in sorted(kem)}, {k: kacc[k] for k in sorted(kacc)},
                 {k: kbat[k] for k in sorted(kbat)}),
                (list(gapped[0]), int(gapped[1])), idle)

    def _gap(self, s: _Slot, gaps: list[int]) -> int:
        """A drained cycle's gap since the end of its thread's previous cycle (see the module's
        docstring), appended to ``gaps``; returns 1 when it was an idle one (not appended).
        ``add_gap`` in specobs/_core.c does the same."""
        tids, ends = self._gap_tids, self._gap_ends
        if self._gap_next >= 0 and s.idx != self._gap_next:
            tids.clear()  # a cycle in between was lost: no gap spans it
            ends.clear()
        self._gap_next = s.idx + 1
        end = s.ts[self.nph]
        try:
            i = tids.index(s.tid)
        except ValueError:
            if len(tids) < GAP_THREADS:
                tids.append(s.tid)
                ends.append(end)
            else:  # the thread whose last cycle ended first makes room
                i = ends.index(min(ends))
                tids[i] = s.tid
                ends[i] = end
            return 0
        gap = max(s.ts[0] - ends[i], 0)
        ends[i] = end
        if gap > self.idle_gap_ns:
            return 1
        gaps.append(gap)
        return 0

    def drain_into(
        self, bound: int, limit: int, trace: list[int], slow_ns: int, want_all: bool
    ) -> tuple[int, int, list[Detail], list[Any]]:
        """:meth:`drain` into the ring's running totals (:meth:`totals`): what the resolver
        calls, so the aggregation is handed nothing for the cycles that need no Python.
        Returns (cycles, sum of their host cycle ns, details, copies to release)."""
        nev = self._ne_elapsed is not None and threading.get_ident() == self._ne_thread
        gpu: list[list[int]] | None = [] if nev else None
        (n, host, total, last, lcounts, accepted, drafted, emitted, kseq, batch_b, batch_n,
         details, released, by_k, gap, idle) = self._drain_locked(bound, limit, trace, slow_ns,
                                                                  want_all, gpu)
        t = self._totals
        if gpu:
            cols = [
                _columns(_bucketing.bucket, _bucketing.bucket_py, [g[i] for g in gpu],
                         self._db, 1e-9)
                for i in range(self.nph + 1)
            ]
            t[10] = [([a + b for a, b in zip(c0, c1, strict=True)], s0 + int(s1))
                     for (c0, s0), (c1, s1) in zip(t[10], cols, strict=True)]
        if n:
            t[0] += n
            t[1] = [([a + b for a, b in zip(c0, c1, strict=True)], s0 + s1)
                    for (c0, s0), (c1, s1) in zip(t[1], host, strict=True)]
            t[2] = [a + b for a, b in zip(t[2], lcounts, strict=True)]
            t[3] += accepted
            t[4] += drafted
            t[5] += emitted
            for k, m in kseq.items():
                t[6][k] = t[6].get(k, 0) + m
            t[7] = ([a + b for a, b in zip(t[7][0], batch_b[0], strict=True)],
                    t[7][1] + batch_b[1])
            t[8] += batch_n
            t[9] = last
            kcyc, khost, kem, kacc, kbat = by_k
            add_counts(t[11], kcyc)
            add_ns_by_k(t[12], khost)
            add_counts(t[13], kem)
            add_counts(t[14], kacc)
            add_counts(t[15], kbat)
            t[16] = ([a + b for a, b in zip(t[16][0], gap[0], strict=True)], t[16][1] + gap[1])
            t[17] += idle
            self.drained += n
        return n, total, details, released

    def counters(self) -> tuple[int, int, int, int, int, int]:
        """(discarded, dropped_queue_full, unsettled, native_gpu_cycles, native_gpu_cost,
        excepted): the counts the resolver folds and the sampler reads after each drain, read
        together."""
        return (self.discarded, self.dropped_queue_full, self.unsettled,
                self.native_gpu_cycles, self.native_gpu_cost, self.excepted)

    def totals(self) -> RingTotals:
        """The running totals of :meth:`drain_into`, copied (the native ring's is the same
        tuple, unnamed: read it with ``RingTotals._make``)."""
        t = self._totals
        return RingTotals(t[0], [(list(c), sm) for c, sm in t[1]], list(t[2]), t[3], t[4], t[5],
                          {k: t[6][k] for k in sorted(t[6])}, (list(t[7][0]), t[7][1]), t[8],
                          t[9], [(list(c), sm) for c, sm in t[10]],
                          {k: t[11][k] for k in sorted(t[11])},
                          {k: list(t[12][k]) for k in sorted(t[12])},
                          {k: t[13][k] for k in sorted(t[13])},
                          {k: t[14][k] for k in sorted(t[14])},
                          {k: t[15][k] for k in sorted(t[15])}, (list(t[16][0]), t[16][1]),
                          t[17])

    def reset_totals(self) -> None:
        """The running totals from zero; no gap spans the reset either."""
        nb, nbb = len(self._db) + 1, len(self._bb) + 1
        self._totals: list[Any] = [
            0, [([0] * nb, 0) for _ in range(self.nph + 1)], [0] * (self.k_max + 1), 0, 0, 0,
            {}, ([0] * nbb, 0), 0, None, [([0] * nb, 0) for _ in range(self.nph + 1)],
            {}, {}, {}, {}, {}, ([0] * nb, 0), 0,
        ]
        self._gap_tids = []
        self._gap_ends = []
        self._gap_next = -1

    def _read_copy(self, s: _Slot, released: list[Any]) -> None:
        """A completed copy of the clock's pinned-buffer type read straight from pinned memory
        (see ``read_copy`` in specobs/_core.c); on any error the copy stays for the resolver."""
        copy = s.copy
        try:
            ptr, isz, n = copy.ptr, copy.itemsize, copy.length
            if not ptr or isz not in (4, 8) or not 0 <= n <= 1 << 20:
                raise ValueError("a pinned copy with no buffer, or of a bad shape")
            ctype = ctypes.c_int64 if isz == 8 else ctypes.c_int32
            values = list((ctype * n).from_address(ptr)) if n else []
        except Exception:
            return
        k = self.k_max
        native = s.emitted is None and (
            s.draft is None or _exact_int_in(s.draft, 0, self.k_max) is not None)
        if native and s.draft is not None:
            k = s.draft
        if native and n <= NATIVE_MAX_SEQ and (not values or (min(values) >= 0
                                                              and max(values) <= k)):
            s.lens = values
            s.nseq = n
            s.k = k
            s.accsum = sum(values)
            s.has_obj_acc = False
            s.draft = None
        else:
            s.acc = values
        released.append(copy)
        s.copy = None

    def clear_queue(self) -> int:
        grave: list[Any] = []
        if not self._lock.acquire():
            return 0  # a signal handler's shutdown inside this thread's begin(): left as it is
        try:
            n = self._clear_queue(grave)
        finally:
            self._lock.release()
        del grave
        return n

    def _clear_queue(self, grave: list[Any]) -> int:
        n = 0
        slots = self._slots
        while self._tail != self._head:
            s = slots[self._tail % len(slots)]
            # Every cycle begun and not resolved, the one still open too (its thread died, or
            # shutdown came first): each is lost here, and counted by the caller.
            if s.state == DONE or s.state == DEFERRED or s.state == OPEN:
                n += 1
            s.state = VOID  # an open cycle's end() finds its slot gone
            self._drop_held(s)
            s.clear_objs(grave)
            self._tail += 1
        self._waiting = 0
        self.held_cycles = 0
        self.deferred = 0
        self.in_flight_index, self.in_flight_polls = -1, 0
        return n

    def expire(self, timeout_ns: int) -> int:
        """Hand on, unsettled, the deferred cycles that ended ``timeout_ns`` or longer ago (on
        the ring's clock): their times are counted, their tokens and batch size not. Returns how
        many. Deferred cycles end in order, so the walk stops at the first one still in time."""
        if not self.deferred or self._hot._is_owned():  # type: ignore[attr-defined]
            return 0  # (a signal handler's, inside this thread's own call: the next pass)
        n = 0
        with self._hot:  # one at a time with the worker's calls and settle()
            now = self._now()
            slots = self._slots
            ns = len(slots)
            for p in range(self._tail, self._head):
                s = slots[p % ns]
                if s.state == OPEN:
                    break
                if s.state != DEFERRED:
                    continue
                if now - s.ts[self.nph] < timeout_ns:
                    break
                self.deferred -= 1
                self.unsettled += 1
                self._clear_acceptance(s)
                self._hand_on(s, wake=False)  # the resolver is the caller
                n += 1
        return n

    def take_dropped(self) -> list[tuple[Any, Any]]:
        out = self.dropped
        self.dropped = []
        return out

    def forget_current(self) -> None:
        cur = self.current
        if cur is not None:
            cur._closed = 1
            s = cur._slot()
            if cur._owns(s):
                s.state = VOID
            self.current = None


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


def poll_pending(held: list[tuple[int, Any, Any]], bound: int, query: Any,
                 polls_before_query: int, memory: list[int]) -> int:
    """The poll over what :meth:`PyRing.pending` returned (``Ring.poll`` in the native core
    does the same in one call): the index bound below which the ``held`` cycles completed.

    Without the driver first: the newest copy whose values landed over the sentinel
    completed, and so did everything before it. A copy first in line and still in flight by
    its sentinel is the bound until it has been first for ``polls_before_query`` polls
    (``memory``: [its index, polls so far], updated here), since its values may never land
    (negative counts); then the events after it are asked. Of the cycles an event tells about
    (sampled ones, fenced copies) a binary search finds the first not complete; the unfenced
    copies before the last complete event are complete in stream order, those after it once
    their values landed."""
    if not held or query is None:
        return bound
    start = _landed_frontier(held)
    if start == len(held):
        return bound
    first = held[start]
    if first[1] is None and first[2].sentinel and not first[2].landed():
        memory[1] = memory[1] + 1 if memory[0] == first[0] else 1
        memory[0] = first[0]
        if memory[1] < polls_before_query:
            return int(first[0])
    held = held[start:]

    def done(h: tuple[int, Any, Any]) -> bool:
        ev = h[1]
        return bool(query(ev[-1] if ev is not None else h[2].event))

    told = [i for i, h in enumerate(held) if h[1] is not None or h[2].fenced]
    lo, hi = 0, len(told)
    while lo < hi:
        mid = (lo + hi) // 2
        if done(held[told[mid]]):
            lo = mid + 1
        else:
            hi = mid
    stop = told[lo] if lo < len(told) else len(held)
    for i in range(told[lo - 1] + 1 if lo else 0, stop):
        if not held[i][2].landed():
            return int(held[i][0])
    return int(held[stop][0]) if stop < len(held) else bound


def _landed_frontier(held: list[tuple[int, Any, Any]]) -> int:
    """How many of the ``held`` cycles (in stream order) completed, by their copies' values
    alone: the newest copy whose values landed over the sentinel completed, and so did every
    cycle before it; its own cycle too unless it holds events (recorded after its copy). Binary
    search over the copies that were filled with the sentinel; no driver call."""
    copies = [i for i, h in enumerate(held) if h[2] is not None and h[2].sentinel]
    lo, hi = 0, len(copies)
    while lo < hi:
        mid = (lo + hi) // 2
        if held[copies[mid]][2].landed():
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        return 0
    j = copies[lo - 1]
    return j if held[j][1] is not None else j + 1
