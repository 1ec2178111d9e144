"""The pure-Python ring, the worker's side: :class:`PyCycle`, the handle ``begin`` returns, and
the ring's ``begin`` with the handles' reuse and the room a full ring makes.

See :mod:`specobs._ring` for the ring as a whole; the slot state both sides share is in
:mod:`specobs._ring_state`.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from specobs._ring_slots import (
    AWAITING,
    DEFERRED,
    DONE,
    MAX_BATCH,
    NATIVE_MAX_SEQ,
    NO_DEFER,
    NOTHING,
    NSPARES,
    OPEN,
    SETTLED,
    VOID,
    Slot,
    exact_int_in,
    payload_bytes,
    payload_len,
    set_batch,
    set_draft_length,
    store_buffer,
    store_lengths,
)
from specobs._ring_state import Handle, RingState, serialized

_getrefcount = getattr(sys, "getrefcount", None)


class PyCycle:
    """One speculative decoding cycle in flight. Created by :meth:`Observer.begin`; also a
    context manager (``with observer.cycle() as c: ...`` ends the cycle on exit)."""

    __slots__ = ("_closed", "_pos", "_ring", "_seq", "_settle", "index")

    def __init__(self, ring: RingWorker, index: int, pos: int) -> None:
        self._ring = ring
        self.index = index
        self._seq = index
        self._pos = pos
        self._closed = 0
        self._settle = NO_DEFER

    def _slot(self) -> Slot:
        slots = self._ring._slots
        return slots[self._pos % len(slots)]

    def _owns(self, s: Slot) -> bool:
        """Whether the slot is still this cycle's and open (a call into Python may let another
        thread close this cycle meanwhile: misuse, an observer is one thread's)."""
        return s.state == OPEN and s.idx == self._seq

    @serialized
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

    @serialized
    def accept(self, accepted: Any, *, draft_length: Any = None, batch_size: Any = None,
               emitted: Any = None) -> None:
        """Record acceptance for this cycle (see :meth:`specobs.CycleHandle.accept`)."""
        r = self._ring
        if self._closed:
            r._misuse("bad_acceptance", "accept() after the cycle ended")
            return
        s = self._slot()
        if not self._owns(s):
            return
        if batch_size is not None:
            set_batch(s, batch_size)
        s.nseq = -1
        s.has_obj_acc = False
        r._payload(s, 0)
        s.acc = s.draft = s.emitted = None
        if s.copy is not None:
            r.dropped.append((None, s.copy))
            s.copy = None
        # What one cycle may carry: at most max_cycle_sequences values in each list, and the
        # objects the waiting cycles keep within max_queue_bytes (what the drafts and emitted
        # counts hold is known now, the acceptance's once it is read).
        most = max(payload_len(draft_length), payload_len(emitted))
        if most > r.max_cycle_sequences or payload_len(accepted) > r.max_cycle_sequences:
            r._refuse_payload(s, "sequences", max(most, payload_len(accepted)),
                              r.max_cycle_sequences)
            return
        with_ = payload_bytes(draft_length) + payload_bytes(emitted)
        k: int | None = r.k_max if draft_length is None else exact_int_in(
            draft_length, 0, r.k_max)
        s.ak = -1 if draft_length is None or k is None else k
        try:
            kept = self._kept(s, accepted, draft_length, emitted, k, with_)
        except Exception as exc:
            r._internal(exc)
            return
        if kept is None:
            return
        s.acc, with_ = kept
        s.has_obj_acc = True
        s.draft = draft_length
        s.emitted = emitted
        r._payload(s, with_)

    def _kept(self, s: Slot, accepted: Any, draft_length: Any, emitted: Any, k: int | None,
              with_: int) -> tuple[Any, int] | None:
        """What :meth:`accept` keeps of ``accepted`` for the resolver, and the bytes the slot
        then holds (``with_``: the drafts' and emitted counts'); or None: the lengths stored in
        the slot, a CUDA tensor handed to the clock's copy, or the acceptance refused (counted),
        or the cycle closed meanwhile."""
        r = self._ring
        native_most = min(r.max_cycle_sequences, NATIVE_MAX_SEQ)
        values: Any = None
        seq: Any = None
        if type(accepted) is list or type(accepted) is tuple:
            seq = accepted
        else:
            if (k is not None and emitted is None
                    and store_buffer(s, accepted, k, native_most)):
                return None
            try:
                cuda = bool(getattr(accepted, "is_cuda", False))
            except Exception:
                cuda = False
            if not self._owns(s) or self._closed:
                return None
            if cuda:
                if r.queued_bytes + with_ > r.max_queue_bytes:
                    r._refuse_payload(s, "bytes", r.queued_bytes + with_, r.max_queue_bytes)
                    return None
                s.draft = draft_length
                s.emitted = emitted
                r._payload(s, with_)
                r._accept_cuda(self, s, accepted)
                return None
            tolist = getattr(accepted, "tolist", None)
            if tolist is not None:
                values = tolist()
                if not self._owns(s) or self._closed:
                    return None
                if payload_len(values) > r.max_cycle_sequences:
                    got = payload_len(values)
                    values = None
                    r._refuse_payload(s, "sequences", got, r.max_cycle_sequences)
                    return None
                if type(values) is list:
                    seq = values
        if seq is not None and k is not None and emitted is None:
            if store_lengths(s, seq, k, native_most):
                return None
        # Kept for the resolver's validation, within what the queue may keep.
        with_ += payload_bytes(values if values is not None else
                               seq if seq is not None else accepted)
        if r.queued_bytes + with_ > r.max_queue_bytes:
            values = None
            r._refuse_payload(s, "bytes", r.queued_bytes + with_, r.max_queue_bytes)
            return None
        if values is not None:
            return values, with_
        return (list(seq) if seq is not None else accepted), with_

    @serialized
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
        if self._settle == AWAITING:
            s.state = DEFERRED  # defer(): handed on by settle() or expire()
            r.deferred += 1
            return
        s.state = DONE
        r.enqueued += 1
        r._waiting += 1
        if s.ev is not None or s.copy is not None:
            r.held_cycles += 1
        if r._waiting >= r.wake_at or (r.deferred and r._waiting >= r.settle_backlog):
            r._call(r.slow.wake)

    @serialized
    def defer(self) -> PyCycle:
        """End the cycle with its acceptance still to come: its phase times are final now, its
        acceptance is given later by :meth:`settle` (from any thread), and the resolver holds
        the cycle until then, or until its timeout (``unsettled``: the times counted, the
        tokens not). Returns this handle: keep it for :meth:`settle`."""
        if self._closed:
            self._ring._misuse("end_without_begin", "defer() on a cycle that already ended")
            return self
        self._settle = AWAITING
        PyCycle.end.__wrapped__(self)  # the lock is held
        s = self._slot()
        if s.state != DEFERRED or s.idx != self._seq:
            self._settle = NOTHING  # discarded (counted there) or begun in graph capture
        return self

    @serialized
    def settle(self, accepted: Any, *, draft_length: Any = None, batch_size: Any = None,
               emitted: Any = None) -> None:
        """Give a deferred cycle its acceptance (as :meth:`accept` takes it; ``None``: count no
        tokens and no batch) and hand the cycle to the resolver. Twice, without ``defer()``, or
        after the timeout: counted (``errors{kind="bad_settle"}``), never raised."""
        r = self._ring
        st = self._settle
        if st == NOTHING:
            return
        if st != AWAITING:
            r._misuse("bad_settle", "settle() twice on one cycle" if st == SETTLED
                      else "settle() on a cycle that was not deferred")
            return
        self._settle = SETTLED
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

    @serialized
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



class RingWorker(RingState):
    """The worker's side of the ring: ``begin``, and what it does to the slots and handles."""

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

    def _take_spare(self) -> Handle | None:
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
        dropped (see ``make_room`` in specobs/_core/ring.c)."""
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
                # Never settled, and the ring needs its slot: lost with its times (``expire``
                # hands such a cycle on before, unless the resolver is not keeping up).
                self.unsettled += 1
                self.deferred -= 1
            old.state = VOID
            self._drop_held(old)
            self._clear_objs(old, grave)
            self._tail += 1
        return dropped

    def _accept_cuda(self, c: PyCycle, s: Slot, tensor: Any) -> None:
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
                v = exact_int_in(n, 0, MAX_BATCH)
                if v is not None:
                    s.batch = v
            return
        s.copy = copy
        s.has_obj_acc = True


    @serialized
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
        self._clear_objs(s)
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
            set_batch(s, batch_size)
        if draft_length is not None:
            set_draft_length(s, draft_length, self.k_max)
        spare = self._take_spare()
        if spare is not None:
            c = spare
            c.index = c._seq = idx
            c._pos = pos
            c._closed = 0
            c._settle = NO_DEFER
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

    def forget_current(self) -> None:
        cur = self.current
        if cur is not None:
            cur._closed = 1
            s = cur._slot()
            if cur._owns(s):
                s.state = VOID
            self.current = None

