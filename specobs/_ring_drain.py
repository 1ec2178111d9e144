"""The pure-Python ring, the resolver's side (:mod:`specobs._ring` describes the whole): the
poll, the drain that walks the waiting cycles into one chunk (:class:`Drained`), the gaps
between a thread's cycles, and the running totals (:class:`RingTotals`)."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import specobs._bucketing as _bucketing
from specobs._ring_results import (
    Detail,
    Drained,
    RingTotals,
    add_chunk,
    add_stamps_by_k,
    copy_totals,
)
from specobs._ring_slots import DONE, GAP_THREADS, NATIVE_MAX_SEQ, VOID, Slot, exact_int_in
from specobs._ring_state import RingState


def _columns(compiled: Any, reference: Any, *args: Any) -> Any:
    """``compiled(*args)``, or the reference's answer if it refused something."""
    try:
        return compiled(*args)
    except Exception:
        return reference(*args)



class _Chunk:
    """What one drain is asked for, and what it gathers slot by slot before it buckets it."""

    __slots__ = (
        "accepted", "batches", "details", "drafted", "emitted", "gaps", "gpu", "idle", "kacc",
        "kbat", "kcyc", "kem", "khost", "kseq", "lens", "released", "slow_ns", "ti", "trace",
        "tss", "want_all",
    )

    def __init__(self, trace: list[int], slow_ns: int, want_all: bool,
                 gpu: list[list[int]] | None) -> None:
        self.trace = trace
        self.slow_ns = slow_ns
        self.want_all = want_all
        #: Where the GPU times the drain reads itself go (``drain_into`` only), else None.
        self.gpu = gpu
        #: The next of ``trace`` to look for.
        self.ti = 0
        self.tss: list[list[int]] = []
        self.lens: list[list[int]] = []
        self.batches: list[int] = []
        self.kseq: dict[int, int] = {}
        self.kcyc: dict[int, int] = {}
        self.khost: dict[int, list[int]] = {}
        self.kem: dict[int, int] = {}
        self.kacc: dict[int, int] = {}
        self.kbat: dict[int, int] = {}
        self.gaps: list[int] = []
        self.idle = 0
        self.accepted = self.drafted = self.emitted = 0
        self.details: list[Detail] = []
        self.released: list[Any] = []


def _detail(s: Slot, ck: int, traced: int) -> Detail:
    """The cycle in ``s`` as the resolver finishes it in Python."""
    native = s.nseq >= 0
    batch = s.batch_obj if s.batch_obj is not None else (s.batch if s.batch >= 0 else None)
    return Detail(
        s.idx, list(s.ts), batch, s.ev, s.cost,
        list(s.lens) if native else s.acc,
        s.k if native else s.draft,
        s.emitted, s.copy, int(native), traced, ck, s.dk_obj,
    )


class RingDrain(RingState):
    """The resolver's side of the ring: what waits, what completed, and the drain."""

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
        """A sampled cycle's GPU phase times through the runtime (see ``specobs_read_gpu`` in
        specobs/_core/events.c): ms as a float, rounded half to even to ns; None when a handle
        cannot be read, the runtime refuses, or a time is negative."""
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
        """Consume the waiting cycles below ``bound`` (at most ``limit``) into one chunk: see
        :class:`Drained`. ``trace``: sorted indices of cycles to hand over as traced;
        ``slow_ns``: host-timed cycles at least this long are traced too (-1: none);
        ``want_all``: hand every cycle over as a detail. The resolver calls
        :meth:`drain_into`; this is the same walk, returned rather than added to the totals."""
        return self._drain_locked(bound, limit, trace, slow_ns, want_all, None)

    def _drain_locked(
        self, bound: int, limit: int, trace: list[int], slow_ns: int, want_all: bool,
        gpu: list[list[int]] | None,
    ) -> Drained:
        if type(trace) is not list:
            raise TypeError("trace must be a list of cycle indices")
        # Python code can switch threads anywhere: the worker's drop of the oldest slots
        # (``_make_room``) waits for the walk (the native ring needs no lock: no Python code
        # runs inside its walk, see ``drop_ref`` in specobs/_core/core.h).
        grave: list[Any] = []
        with self._lock:
            out = self._drain(bound, limit, _Chunk(trace, slow_ns, want_all, gpu), grave)
        del grave  # what callers passed is freed here, outside the walk and the lock
        return out


    def _drain(self, bound: int, limit: int, c: _Chunk, grave: list[Any]) -> Drained:
        """The walk: the waiting cycles below ``bound``, at most ``limit``, taken into ``c``
        in order; void slots passed, an open or deferred one stops it. ``c.gpu``:
        drain_into on the thread the runtime reads on (``set_native_events``): sampled cycles
        that need Python for nothing else have their GPU times read here, appended to it (the
        phases, then the cycle), and their events handed back in ``released``."""
        n = 0
        slots = self._slots
        ns = len(slots)
        while self._tail != self._head and n < limit:
            s = slots[self._tail % ns]
            if s.state == VOID:
                self._drop_held(s)
                self._clear_objs(s, grave)
                self._tail += 1
                continue
            if s.state != DONE or s.idx >= bound:
                break
            self._take(s, c)
            self._clear_objs(s, grave)
            s.ev = s.copy = None
            s.state = VOID
            self._tail += 1
            self._waiting -= 1
            n += 1
        return self._bucketed(c, n)

    def _take(self, s: Slot, c: _Chunk) -> None:
        """One done cycle into the chunk: counted, and handed over as a detail when it needs
        Python."""
        self.held_cycles -= s.ev is not None or s.copy is not None
        c.tss.append(s.ts)
        c.idle += self._gap(s, c.gaps)
        if (s.copy is not None and s.nseq < 0 and s.acc is None and self.copy_type is not None
                and type(s.copy) is self.copy_type):
            self._read_copy(s, c.released)
        ck, py_batch = self._count(s, c)
        traced = self._traced(s, c)
        gpu_read = (c.gpu is not None and s.ev is not None and not c.want_all and not traced
                    and not py_batch and s.copy is None and s.acc is None
                    and s.emitted is None and s.dk_obj is None and self._gpu_read(s, c, c.gpu))
        if (c.want_all or traced or py_batch or (s.ev is not None and not gpu_read)
                or s.copy is not None or s.acc is not None or s.emitted is not None
                or s.dk_obj is not None):
            c.details.append(_detail(s, ck, traced))

    def _count(self, s: Slot, c: _Chunk) -> tuple[int, bool]:
        """The cycle's native counts into the chunk; returns its draft length
        (:attr:`Detail.cycle_k`) and whether its batch size is the resolver's to count."""
        nseq = s.nseq
        if nseq >= 0:
            if s.k > 0:  # a sequence that drafted nothing has no accept length
                c.lens.append(s.lens)
            c.accepted += s.accsum
            c.drafted += s.k * nseq
            c.emitted += s.accsum + nseq
            c.kseq[s.k] = c.kseq.get(s.k, 0) + nseq
            c.kacc[s.k] = c.kacc.get(s.k, 0) + s.accsum
        ck = s.cycle_k()
        if ck >= 0:
            c.kcyc[ck] = c.kcyc.get(ck, 0) + 1
            add_stamps_by_k(c.khost, ck, s.ts, self.nph)
            c.kem[ck] = c.kem.get(ck, 0) + (s.accsum + nseq if nseq >= 0 else 0)
        py_batch = s.batch_obj is not None or s.has_obj_acc
        b = -1
        if not py_batch:
            b = s.batch if s.batch >= 0 else nseq
            if b >= 0:
                c.batches.append(b)
        if ck >= 0:  # the resolver adds the batch sizes it validates
            c.kbat[ck] = c.kbat.get(ck, 0) + max(b, 0)
        return ck, py_batch

    def _traced(self, s: Slot, c: _Chunk) -> int:
        """1 when the cycle is one of ``trace`` (passing the ones before it), or host-timed at
        least ``slow_ns``."""
        traced = 0
        trace = c.trace
        while c.ti < len(trace):
            want = trace[c.ti]
            if want > s.idx:
                break
            c.ti += 1
            if want == s.idx:
                traced = 1
        if c.slow_ns >= 0 and s.ev is None and s.ts[self.nph] - s.ts[0] >= c.slow_ns:
            traced = 1
        return traced

    def _gpu_read(self, s: Slot, c: _Chunk, gpu: list[list[int]]) -> bool:
        """Whether the sampled cycle's GPU times were read here (into ``gpu``, its events
        released); not when a handle cannot be read, or the cycle is slow by them."""
        g = self._read_gpu(s.ev)
        if g is None or (c.slow_ns >= 0 and sum(g) >= c.slow_ns):
            return False
        gpu.append([*g, sum(g)])
        c.released.append(s.ev)
        self.native_gpu_cycles += 1
        self.native_gpu_cost += s.cost
        return True

    def _bucketed(self, c: _Chunk, n: int) -> Drained:
        """The chunk of ``n`` cycles by columns, with the resolver's bucketing (compiled where
        built; the same answers)."""
        nph = self.nph
        w = self.k_max + 1
        tss = c.tss
        if tss:
            hl, total = _columns(_bucketing.host_chunk, _bucketing.host_chunk_py,
                                 tss, nph, self._db)
        else:
            hl, total = [([0] * (len(self._db) + 1), 0) for _ in range(nph + 1)], 0
        lcounts = (_columns(_bucketing.count_lengths, _bucketing.count_lengths_py,
                            c.lens, self.k_max, w) if c.lens else [0] * w)
        bucketed = _columns(_bucketing.bucket, _bucketing.bucket_py, c.batches, self._bb, 1.0)
        gapped = _columns(_bucketing.bucket, _bucketing.bucket_py, c.gaps, self._db, 1e-9)

        def by_k(d: dict[int, Any]) -> dict[int, Any]:
            return {k: d[k] for k in sorted(d)}

        return Drained(
            n, [(list(h), int(t)) for h, t in hl], total, tss[-1][nph] if tss else None,
            list(lcounts), c.accepted, c.drafted, c.emitted, by_k(c.kseq),
            (list(bucketed[0]), bucketed[1]), len(c.batches), c.details, c.released,
            (by_k(c.kcyc), by_k(c.khost), by_k(c.kem), by_k(c.kacc), by_k(c.kbat)),
            (list(gapped[0]), int(gapped[1])), c.idle)

    def _gap(self, s: Slot, gaps: list[int]) -> int:
        """A drained cycle's gap since the end of its thread's previous cycle (see the module's
        docstring), appended to ``gaps``; returns 1 when it was an idle one (not appended).
        ``add_gap`` in specobs/_core/core.h does the same."""
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
        chunk = self._drain_locked(bound, limit, trace, slow_ns, want_all, gpu)
        cols = [
            _columns(_bucketing.bucket, _bucketing.bucket_py, [g[i] for g in gpu],
                     self._db, 1e-9)
            for i in range(self.nph + 1)
        ] if gpu else None
        self._totals = add_chunk(self._totals, chunk, cols)
        self.drained += chunk.cycles
        return chunk.cycles, chunk.host_cycle_ns, chunk.details, chunk.released

    def totals(self) -> RingTotals:
        """The running totals of :meth:`drain_into`, copied (the native ring's is the same
        tuple, unnamed: read it with ``RingTotals._make``)."""
        return copy_totals(self._totals)

    def _read_copy(self, s: Slot, released: list[Any]) -> None:
        """A completed copy of the clock's pinned-buffer type read straight from pinned memory
        (see ``specobs_read_copy`` in specobs/_core/copies.c); on any error the copy stays for
        the resolver."""
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
            s.draft is None or exact_int_in(s.draft, 0, self.k_max) is not None)
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
