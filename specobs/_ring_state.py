"""The pure-Python ring's state: its slots between tail and head, its counters and settings,
its locks, and the slot bookkeeping the worker's side and the resolver's side share.

:class:`RingState` is the base of :class:`specobs._ring.PyRing`; the worker's side
(:mod:`specobs._ring_worker`) and the resolver's (:mod:`specobs._ring_drain`) add to it.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

from specobs._ring_results import zero_totals
from specobs._ring_slots import (
    DEFERRED,
    DONE,
    IDLE_GAP_NS,
    MAX_CYCLE_SEQUENCES,
    MAX_PHASES,
    MAX_QUEUE_BYTES,
    NSPARES,
    OPEN,
    VOID,
    Slot,
)
from specobs._signalsafe import GuardedLock

_perf = time.perf_counter_ns


class Handle(Protocol):
    """What the ring reads and resets of a cycle handle (:class:`specobs._ring.PyCycle`)."""

    index: int
    _seq: int
    _pos: int
    _closed: int
    _settle: int

    def _slot(self) -> Slot: ...

    def _owns(self, s: Slot) -> bool: ...


#: Every pure-Python ring, for the fork handler below.
_RINGS: weakref.WeakSet[RingState] = weakref.WeakSet()


def _new_locks_in_child() -> None:
    """After fork: the child has only the forking thread, so a lock another thread held at the
    fork would never be released; each ring gets new ones (the native core does the same with
    its generation counter)."""
    for ring in list(_RINGS):
        ring._lock = GuardedLock()
        ring._hot = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)



def serialized(method: Any) -> Any:
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
        ring = self if isinstance(self, RingState) else self._ring
        hot = ring._hot
        if hot._is_owned():  # type: ignore[union-attr]  # the C RLock has it
            ring._misuse("signal_reentry", f"{name}() called while this thread was inside "
                         "another call of the same observer (a signal handler?); refused")
            return ring.null_cycle if name == "begin" else self if name == "defer" else None
        with hot:
            return method(self, *args, **kwargs)

    return call



class RingState:
    """The ring's slots, counters and locks; see :mod:`specobs._ring`."""

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
        self._slots = [Slot() for _ in range(capacity + 1)]
        self._head = 0
        self._tail = 0
        self.k_max = max_draft_length
        self.wake_at = wake_at
        self._init_bounds(duration_bounds, batch_bounds)
        self.null_cycle = null_cycle
        self._init_counters()
        self._init_gpu()
        self._waiting = 0
        self._lock = GuardedLock()  # never waited for by its holder (a signal handler)
        #: Held by the hot path's calls (``serialized``): one at a time, as the native core's
        #: are under the GIL.
        self._hot = threading.RLock()
        _RINGS.add(self)  # both locks made anew in a forked child (a lost thread may hold one)
        #: Tests: a clock advancing ``tick`` ns per read instead of ``perf_counter_ns`` (0).
        self._now: Any = _perf
        self._tick = 0
        self._fake_now = 0
        #: The open cycle, or None: read by the recorder, written only here (in C, a getter).
        self.current: Handle | None = None
        #: Closed handles kept for reuse (see ``close_current`` in specobs/_core/ring.c).
        self._spares: list[Handle | None] = [None] * NSPARES
        self.dropped: list[tuple[Any, Any]] = []
        #: Cycles :meth:`drain_into` has taken (the aggregation's generation moves with it).
        self.drained = 0
        self.reset_totals()

    def _init_bounds(self, duration_bounds: Sequence[float], batch_bounds: Sequence[float]
                     ) -> None:
        """The backlog and payload bounds, and the histograms' bucket bounds."""
        #: A deferred cycle with this many done cycles waiting behind it is handed on unsettled
        #: without waiting out its timeout (:meth:`expire`): the drain takes cycles in order, so
        #: one that is never settled would hold every later one up until then. Half the ring at
        #: most, so that it is handed on before a full ring drops it; the worker wakes the
        #: resolver when it is reached.
        self.settle_backlog = max(1, min(self.wake_at, self.capacity // 2))
        #: What one cycle's acceptance may carry: at most this many values in each list (its
        #: accepted lengths, draft lengths, emitted counts), and the objects the waiting cycles
        #: keep for the resolver within this many bytes, as :func:`payload_bytes` estimates
        #: them (``queued_bytes``). A cycle past either keeps its times, not its acceptance:
        #: the recorder counts it (``oversized``).
        self.max_cycle_sequences = MAX_CYCLE_SEQUENCES
        self.max_queue_bytes = MAX_QUEUE_BYTES
        self.queued_bytes = 0
        self._db = list(map(float, duration_bounds))
        self._bb = list(map(float, batch_bounds))
        for b in (self._db, self._bb):
            if any(not y > x for x, y in itertools.pairwise(b)):
                raise ValueError("bounds must be strictly increasing")

    def _init_counters(self) -> None:
        """The worker's switches and the counts the resolver reads."""
        #: Recording on; GPU-timing sampled cycles, one in ``interval``; the cycle index from
        #: which ``begin`` asks the recorder to try a clock (-1: never).
        self.enabled, self.sampling, self.interval, self.clock_try_at = 1, 0, 1, -1
        #: Cycles begun, and the native id of the thread that began the last one (0: none yet).
        self.begun = self.writer = 0
        #: Gaps between a thread's cycles longer than this (ns) are counted as idle, not
        #: observed (``Settings.idle_gap_seconds``).
        self.idle_gap_ns = IDLE_GAP_NS
        #: Cycles handed to the resolver; ended by defer() awaiting settle(); handed on
        #: unsettled by the timeout; dropped by a full ring.
        self.enqueued = self.deferred = self.unsettled = self.dropped_queue_full = 0
        #: Cycles discarded as misuse; discarded because the engine raised inside ``with`` (not
        #: misuse); and what the acceptance copies cost the worker (ns).
        self.discarded = self.excepted = self.copy_ns = 0
        #: The native core drains the common case with the GIL let go (``nogil_*``: cycles, walks,
        #: thread CPU ns); Python cannot, so these stay 0 here.
        self.nogil_cycles = self.nogil_walks = self.nogil_ns = 0
        self.walk_cpu_out = self.walk_cpu_in = self.walk_hold_ns = self.walk_count = 0

    def _init_gpu(self) -> None:
        """What the ring reads of sampled cycles and copies itself."""
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

    def reset_totals(self) -> None:
        """The running totals from zero; no gap spans the reset either."""
        self._totals = zero_totals(self.nph, len(self._db) + 1, len(self._bb) + 1, self.k_max)
        #: The gaps' memory: the last end stamp of each recording thread seen (two lists, as the
        #: native core's arrays), and the index the next drained cycle has when none was lost in
        #: between (-1: none drained yet).
        self._gap_tids: list[int] = []
        self._gap_ends: list[int] = []
        self._gap_next = -1

    def counters(self) -> tuple[int, int, int, int, int, int]:
        """(discarded, dropped_queue_full, unsettled, native_gpu_cycles, native_gpu_cost,
        excepted): the counts the resolver folds and the sampler reads after each drain, read
        together."""
        return (self.discarded, self.dropped_queue_full, self.unsettled,
                self.native_gpu_cycles, self.native_gpu_cost, self.excepted)


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

    def _record(self, s: Slot, i: int, t: int) -> None:
        try:
            self.record_fn(s.ev[i], self.stream)
            s.cost += self._now() - t
        except Exception as exc:
            self._internal(exc)

    def _drop_held(self, s: Slot) -> None:
        if s.ev is None and s.copy is None:
            return
        self.dropped.append((s.ev, s.copy))
        s.ev = s.copy = None

    def _payload(self, s: Slot, nbytes: int) -> None:
        """The estimated bytes the slot's kept objects hold, and the ring's count of them."""
        self.queued_bytes += nbytes - s.pbytes
        s.pbytes = nbytes

    def _clear_objs(self, s: Slot, grave: list[Any] | None = None) -> None:
        self._payload(s, 0)
        s.clear_objs(grave)

    def _refuse_payload(self, s: Slot, kind: str, got: int, bound: int) -> None:
        """The cycle's acceptance refused for its size (``kind``: ``"sequences"``, more than
        ``max_cycle_sequences`` in one list; ``"bytes"``, past ``max_queue_bytes``): it keeps
        its times and batch size, no tokens; the recorder counts it and says so. Its
        acceptance was cleared before."""
        s.nseq = -1
        s.ak = -1
        s.has_obj_acc = False
        self._call(self.slow.oversized, kind, got, bound)

    def _clear_acceptance(self, s: Slot) -> None:
        """No tokens and no batch size for this cycle (its times stay, and begin's draft
        length)."""
        self._payload(s, 0)
        s.nseq = -1
        s.ak = -1
        s.has_obj_acc = False
        s.batch = -1
        s.acc = s.draft = s.emitted = s.batch_obj = None
        if s.copy is not None:
            self.dropped.append((None, s.copy))
            s.copy = None

    def _hand_on(self, s: Slot, wake: bool = True) -> None:
        """A deferred cycle is done: the resolver may take it (woken by the worker's side)."""
        s.state = DONE
        self.enqueued += 1
        self._waiting += 1
        if s.ev is not None or s.copy is not None:
            self.held_cycles += 1
        if wake and (self._waiting >= self.wake_at
                     or (self.deferred and self._waiting >= self.settle_backlog)):
            self._call(self.slow.wake)

    def _void(self, s: Slot) -> None:
        s.state = VOID
        self._drop_held(s)

    def _discard(self, s: Slot) -> None:
        """A cycle called out of order: counted as misuse."""
        self.discarded += 1
        self._void(s)


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
            self._clear_objs(s, grave)
            self._tail += 1
        self._waiting = 0
        self.held_cycles = 0
        self.deferred = 0
        self.in_flight_index, self.in_flight_polls = -1, 0
        return n

    def expire(self, timeout_ns: int) -> int:
        """Hand on, unsettled, the deferred cycles that ended ``timeout_ns`` or longer ago (on
        the ring's clock), or that have :attr:`settle_backlog` done cycles waiting behind them:
        their times are counted, their tokens and batch size not. Returns how many. Deferred
        cycles end in order, so the walk stops at the first one still in time with fewer
        waiting behind it."""
        if not self.deferred or self._hot._is_owned():  # type: ignore[attr-defined]
            return 0  # (a signal handler's, inside this thread's own call: the next pass)
        n = 0
        with self._hot:  # one at a time with the worker's calls and settle()
            now = self._now()
            slots = self._slots
            ns = len(slots)
            behind = self._waiting  # done cycles after the slot walked
            for p in range(self._tail, self._head):
                s = slots[p % ns]
                if s.state == OPEN:
                    break
                if s.state == DONE:
                    behind -= 1
                if s.state != DEFERRED:
                    continue
                if now - s.ts[self.nph] < timeout_ns and behind < self.settle_backlog:
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

