"""The resolver: a background thread that turns cycle records into the aggregation.

It follows OpenTelemetry's batch processor: a named daemon thread waking on
``threading.Event.wait(poll_interval)``, a bounded backlog that drops the oldest record and
counts it, ``force_flush`` and ``shutdown`` as the only blocking calls (both bounded in time), and
a rebuild after ``fork()``.

Why no synchronisation is ever needed: records are resolved strictly in order, and a record is
taken only once the *last* event it holds reports ``query() == True``. Events on one stream
complete in order, so every earlier boundary of that cycle has completed too and
``elapsed_time`` can be read without waiting. A record whose events are still pending simply stays
at the head of the backlog until a later poll. The worker never waits for the resolver; the
resolver never waits for the GPU.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from specobs import _acceptance, _bucketing, catalog, sampling
from specobs._acceptance import Record, batch_acceptance, resolved_acceptance
from specobs._aggregation import Chunk
from specobs._bucketing import Bucketed
from specobs._model import Acceptance, BatchAcceptance, ResolvedCycle
from specobs._recorder import short_repr
from specobs._ring import ByDraftLength, Detail, add_stamps_by_k
from specobs._signalsafe import GuardedLock, Reentered, Wakeup

if TYPE_CHECKING:
    from specobs._aggregation import Aggregation
    from specobs._recorder import Recorder
    from specobs.sinks._base import Sink
    from specobs.timing import WallAnchor

__all__ = ["Resolver"]

#: How often the resolver reads the recording thread's CPU and wait times (one small /proc
#: file; every snapshot reads it too).
THREAD_TIME_READ_SECONDS = 0.1
#: Records resolved in the first GIL hold of a new resolver; after that the count follows the
#: measured length of each hold (see ``drain``): doubled after a full slice under half of
#: ``SLICE_NS``, shrunk in proportion after one over it, within ``MIN_CHUNK``..``MAX_CHUNK``.
CHUNK = 32
#: Thread CPU one hold of the GIL aims at. The worker shares the GIL: a worker whose GPU sync
#: returns while the resolver holds it waits for the rest of the hold, so holds are bounded by
#: time, not by a count of records (a record costs 0.3-50 µs). Measured side by side
#: (benchmarks/RESULTS.md, issue 15): on the CPU VM, with the compiled bucketing, 80 µs
#: slices keep 98 % of the holds under 100 µs (with 200 µs slices most are over) for 0.3 µs
#: more process CPU per cycle; on the H200, 80 and 200 µs slices gave the same throughput on
#: every workload in one run (0.973 / 0.972 on 0.22 ms graph cycles); across fresh machines
#: the figures move by more than that.
SLICE_NS = 80_000
MIN_CHUNK = 16
MAX_CHUNK = 2048
#: Pause between two slices of one drain. ``time.sleep(0)`` releases the GIL but does not hand
#: it over: the resolver's own syscall returns before the woken worker is scheduled, and it
#: takes the GIL straight back (the worker then waits out the 5 ms switch interval). A real
#: sleep lets a waiting worker in.
YIELD_SECONDS = 20e-6
#: Pause before the resolver's loop starts again after an exception ended it.
RESTART_PAUSE_SECONDS = 0.05

_log = logging.getLogger("specobs")
_perf = time.perf_counter_ns
T = TypeVar("T")


def _or_reference(compiled: Callable[..., T], reference: Callable[..., T], *args: Any) -> T:
    """``compiled(*args)``, or the pure-Python reference's answer if the compiled version
    refused something (:mod:`specobs._bucketing`); looked up per call, so a benchmark can swap
    the module's functions."""
    try:
        return compiled(*args)
    except Exception:
        return reference(*args)


def _bucket(values: list[int], bounds: Sequence[float], scale: float = 1e-9) -> Bucketed:
    return _or_reference(_bucketing.bucket, _bucketing.bucket_py, values, bounds, scale)


def next_chunk(limit: int, taken: int, cpu_ns: int, slice_ns: int) -> int:
    """How many records the next slice may take, after one that could take ``limit``, took
    ``taken`` and held the GIL ``cpu_ns``: sized by time, since a record costs 0.5-50 µs
    depending on batch size, GPU sampling, sinks and the machine, so no fixed count bounds the
    hold. Doubled after a full slice well under ``slice_ns``, shrunk in proportion after any
    slice over it, within ``MIN_CHUNK``..``MAX_CHUNK``. Not from ``cpu_ns / taken``: a slice's
    fixed cost (~10 µs, more under contention) would read as per-record cost and shrink slices
    until fixed cost is all they do."""
    if taken >= limit and cpu_ns * 2 < slice_ns:
        return min(MAX_CHUNK, limit * 2)
    if cpu_ns > slice_ns and taken > MIN_CHUNK:
        return max(MIN_CHUNK, taken * slice_ns // cpu_ns)
    return limit


def _sink_failed(sink: Any, exc: BaseException) -> Callable[[], str]:
    """The message for a sink whose ``on_cycles`` raised, built only if logged."""
    return lambda: (f"sink {type(sink).__name__} raised {short_repr(exc, 200)} from on_cycles; "
                    f"its cycles of that chunk are lost to it (the aggregation has them)")


def _restarted(exc: BaseException) -> Callable[[], str]:
    """The message for a resolver loop that ended by an exception, built only if logged."""
    return lambda: (f"the resolver thread ended by {short_repr(exc, 200)}; started again "
                    f"(nothing it had aggregated is lost)")


def _unread_copy(exc: BaseException) -> Callable[[], str]:
    """The message for a copied acceptance that could not be read, built only if logged."""
    return lambda: "could not read the copied acceptance: " + short_repr(exc, 200)


class Resolver:
    """Owns the background thread of one observer."""

    def __init__(
        self,
        recorder: Recorder,
        aggregation: Aggregation,
        sinks: Sequence[Sink],
        anchor: WallAnchor,
        *,
        poll_interval_seconds: float,
        overhead_budget: float,
        trace_head_rate: float,
        trace_slow_cycle_seconds: float | None,
        want_traces: bool,
        want_cycles: bool = False,
        name: str = "specobs-resolver",
    ) -> None:
        self.rec = recorder
        self.agg = aggregation
        aggregation.catch_up = self.catch_up
        self.sinks = list(sinks)
        self.anchor = anchor
        self.poll = poll_interval_seconds
        self.chunk = CHUNK
        self._next_trace = 0
        self.budget = overhead_budget
        self.head_rate = trace_head_rate
        self.slow_ns = None if trace_slow_cycle_seconds is None else int(
            trace_slow_cycle_seconds * 1e9
        )
        self.want_traces = want_traces
        self.want_cycles = want_cycles
        self.name = name
        self._rng = random.Random()
        self._init_sync_state()
        # Adaptive sampling state (EWMA of the cost of a sampled cycle and of cycle time).
        self._cost_ewma = 0.0
        self._cycle_ewma = 0.0
        self._copy_ewma = 0.0  # worker ns per cycle starting CUDA acceptance copies
        self._read_ewma = 0.0  # resolver ns reading one sampled cycle's events
        self._copy_seen = 0
        self._enqueued_seen = 0
        #: The clock whose runtime functions the ring reads sampled cycles' GPU times through
        #: (``set_native_events``, on this thread), and the ring's counts of those cycles and
        #: of their record cost so far.
        self._native_events: Any = None
        self._native_seen: tuple[int, ...] = (0, 0)
        self._folded: dict[str, int] = {}
        self._fold_seen: tuple[Any, ...] = ()
        self._cpu_pending = 0  # the resolver's thread CPU not yet added to the aggregation
        #: The sampler's figures since it last ran (cost, sampled, cycles' host ns, cycles,
        #: read ns): it runs at most every ADAPT_EVERY_NS, not every slice.
        self._adapt_due = 0
        self._adapt_pending = [0, 0, 0, 0, 0]
        #: Longest single hold of the GIL by this resolver's work (thread CPU nanoseconds of
        #: one slice, between two points where it releases the GIL), for benchmarks.
        self.max_hold_ns = 0
        self.long_holds = 0  # slices over 100 µs (a garbage collection inside one, say)
        #: The last slices' holds (thread CPU ns), for benchmarks' percentiles.
        self.holds: deque[int] = deque(maxlen=4096)
        #: EWMA of the resolver's thread CPU under the GIL per cycle that ended, and that CPU
        #: and the cycles (``rec.enqueued``) since it last moved: it moves once at least
        #: RESOLVER_FIGURE_CYCLES cycles or RESOLVER_FIGURE_NS have passed.
        self._record_ns = 0.0
        self._cpu_acc = 0
        self._cpu_acc_cycles_from = 0
        self._cpu_acc_since = _perf()
        self.slices = 0  # GIL holds taken (slices of work), for benchmarks
        self.slice_ns = SLICE_NS
        self.yield_seconds = YIELD_SECONDS
        #: Wait and walk inside the native ring's ``pump`` (the GIL let go) where the ring has
        #: one; False: the loop of waits and drains alone (benchmarks compare the two).
        self.use_pump = True
        self.pump_returns: dict[str, int] = {}  # why each pump() came back, for benchmarks
        self._pump_seen = 0  # the ring's pump CPU already added
        self._copy_added = 0  # the worker's acceptance-copy time already added (ring ns)

    #: How long a cycle ended by ``defer()`` waits for its ``settle()`` (ring clock ns); the
    #: observer sets it from ``settle_timeout_seconds``.
    settle_timeout_ns = 5_000_000_000

    def _init_sync_state(self) -> None:
        self.consumed = 0  # cycles taken off the ring by the resolver
        self.drains = 0  # completed drain passes (force_flush waits for one that began later)
        # Set by the worker's end() and by force_flush(), from signal handlers too: a set()
        # that takes no lock Python code holds (see specobs/_signalsafe.py).
        self._wake = Wakeup()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._flush_waiters = 0  # force_flush calls waiting on _cond
        #: Thread CPU ns when the resolver's thread last took the GIL back at a point where it
        #: let go of it (None: not tracked); each stretch from there to the next is one hold.
        self._held_since: int | None = None
        self._run_ident = 0  # the resolver's thread while it runs its loop
        self._drain_lock = GuardedLock()  # never waited for by the thread that holds it
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        t = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread = t
        t.start()

    def after_fork_in_child(self, *, start: bool = True) -> None:
        """Rebuild locks and the thread, and start the child's totals from zero.

        The parent's records (queued or already aggregated) are the parent's: it resolves and
        exports them itself. The child's aggregation starts empty with a new creation time, so
        a child exporting by OTLP never re-reports the parent's cycles; the records the parent
        had queued are dropped here and counted as ``dropped{reason="fork"}``.
        """
        rec = self.rec
        lost = rec.ring.clear_queue()
        rec.ring.forget_current()
        rec.ring.take_dropped()  # the parent's events: not this process's to release
        self._init_sync_state()
        self._rng = random.Random()  # else parent and child draw the same trace ids
        self._next_trace = rec.begun
        self.consumed = rec.enqueued - rec.dropped_queue_full
        self.agg.after_fork_in_child()
        # What the recorder counted before the fork belongs to the parent: fold from here on.
        self._folded = {
            **self._drops_now(rec.ring.counters()),
            **{"err:" + kind: n for kind, n in list(rec.errors.items())},
        }
        self._cost_ewma = 0.0
        self._cycle_ewma = 0.0
        self._copy_ewma = 0.0
        self._read_ewma = 0.0
        self._copy_seen = self._copy_added = rec.copy_ns
        self._enqueued_seen = self._cpu_acc_cycles_from = rec.enqueued
        self._record_ns = 0.0
        self._cpu_acc = 0
        self.agg.count_dropped("fork", lost)
        if start:
            self.start()

    def wake(self) -> None:
        self._wake.set()
        pump_wake = getattr(self.rec.ring, "pump_wake", None)
        if pump_wake is not None:
            pump_wake()

    def _run(self) -> None:
        """The thread's body, supervised: the loop catches what sinks and drains raise, and
        anything that still ends it (a ``BaseException`` from elsewhere, a specobs bug) starts
        it again on this thread after a pause, counted as ``errors{kind="resolver_restart"}``
        and logged (rate-limited), until ``shutdown``."""
        self._run_ident = threading.get_ident()  # drain() on this thread is the loop's
        try:
            while True:
                try:
                    self._loop()
                    return
                except BaseException as exc:  # a dead resolver would lose everything after
                    if self._stop.is_set():
                        return
                    self.rec.misuse("resolver_restart", _restarted(exc))
                    # A pause, so a fault that recurs at once costs a wake-up per pause, not a
                    # spinning core; shutdown ends it early.
                    self._stop.wait(RESTART_PAUSE_SECONDS)
        finally:
            self._run_ident = 0

    def _loop(self) -> None:
        bound = None
        next_thread_read = 0.0
        self._held_since = time.thread_time_ns()
        while not self._stop.is_set():
            clock = self.rec.clock
            if clock is not bound and clock is not None:
                # A CUDA clock reads its events through the runtime directly on this thread
                # (one call per phase instead of torch's five, with the GIL released).
                bound = clock
                bind = getattr(clock, "bind_thread", None)
                if bind is not None:
                    try:
                        bind()
                    except Exception as exc:
                        _log.info("specobs: could not bind the resolver to the clock: %r", exc)
            ring = self.rec.ring
            pump = getattr(ring, "pump", None)
            self._release_point()
            if (pump is not None and self.use_pump and not self.want_cycles
                    and not getattr(clock, "stream_switched", False)):
                # The steady state in C: waits, polls and walks with the GIL let go, back here
                # only for what needs Python (see Ring.pump).
                why = pump(
                    int(self.poll * 1e9),
                    self._next_trace if self.want_traces and self.head_rate > 0.0 else -1,
                    -1 if self.slow_ns is None else self.slow_ns,
                    self.settle_timeout_ns,
                    # No periodic return: what the resolver's Python does besides the cycles
                    # that need it (the sampler's figures, counts made in Python, its CPU), the
                    # export path does before each snapshot (``catch_up``).
                    -1,
                )
                self._held_since = ring.pump_cpu_in
                self.pump_returns[why] = self.pump_returns.get(why, 0) + 1
            else:
                self._wake.wait(self.poll)
                self._held_since = time.thread_time_ns()
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.drain()
            except Exception as exc:  # keep the thread alive whatever a sink does
                _log.exception("specobs: resolver error, continuing: %r", exc)
            now = time.monotonic()
            if now >= next_thread_read:
                # The recording thread's CPU and wait times from its first cycles on, not only
                # from the first scrape: a lifetime the doctor can compare a recent window with.
                next_thread_read = now + THREAD_TIME_READ_SECONDS
                self.agg.read_thread_time()
                self._add_cpu()

    def force_flush(self, timeout_seconds: float) -> bool:
        """Wait until every record enqueued before this call is resolved and handed to sinks.

        Returns False if that did not happen within ``timeout_seconds`` (e.g. GPU work that has
        not finished yet). Never waits longer. Called by a signal handler that interrupted this
        thread inside a drain (or by a sink, from the resolver's own thread), it returns False
        once it would have to wait for that drain: the drain goes on when the handler returns.
        """
        try:
            return self._force_flush(timeout_seconds)
        except Reentered:
            return False

    def _force_flush(self, timeout_seconds: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        target = self.rec.enqueued
        # Two passes later, one pass began after this call: it folded every count made before
        # it (misuse with no record behind it, say) into the aggregation.
        passes = self.drains + 2
        while True:
            if self._thread is None or not self._thread.is_alive():
                self.drain()
                self.drain()
            else:
                self.wake()
            if (
                self.consumed + self.rec.dropped_queue_full >= target
                and not len(self.rec.ring)
                and self.drains >= passes
            ):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._cond:
                self._flush_waiters += 1  # the resolver notifies only while someone waits
                try:
                    self._cond.wait(min(remaining, 0.002))
                finally:
                    self._flush_waiters -= 1
        self._add_cpu()  # what the loop has not added yet: a flush's snapshot sees it
        return all(bool(r) for r in _call_sinks(self.sinks, "force_flush", deadline))

    def shutdown(self, timeout_seconds: float) -> None:
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        # Recording has stopped: a deferred cycle's settle() would come too late now.
        self.rec.ring.expire(0)
        self.force_flush(max(0.0, (deadline - time.monotonic()) / 2))
        self._stop.set()
        self.wake()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(max(0.0, min(1.0, deadline - time.monotonic())))
        # Whatever is still pending (GPU never completed in time) is dropped and counted. The
        # resolver holds the lock while it hands a chunk to the sinks, so a sink that never
        # returns from on_cycles would hold it forever: wait only for what is left of the time.
        locked = self._drain_lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
        try:
            # Recording stopped before this; the ring is cleared under the GIL either way (a
            # resolver wedged in on_cycles does not touch it there).
            lost = self.rec.ring.clear_queue()
            if not locked:
                _log.warning(
                    "specobs: the resolver is still inside a sink's on_cycles; shutting down "
                    "without it (%d records counted as dropped)", lost,
                )
            self.agg.count_dropped("shutdown", lost)
        finally:
            if locked:
                self._drain_lock.release()
        _call_sinks(self.sinks, "shutdown", deadline)

    # -- the work --------------------------------------------------------------------------------
    def catch_up(self) -> None:
        """Before a snapshot, on the export path's thread: while the pump keeps the resolver's
        thread in C, what its Python would have done by now -- the cycles the pump walked
        handed over (``force_flush``'s count, the sampler's figures), the references it parked
        handed back, counts made in Python folded in, its CPU added. Walks nothing (the pump
        lets go of the ring for the one call that takes these, and goes on). Nothing when the
        resolver's own loop is not pumping."""
        ring = self.rec.ring
        if not getattr(ring, "pumping", 0) or threading.get_ident() == self._run_ident:
            return
        # Busy: a drain is running (the pump came back), which does all this itself. Never
        # waited for: a snapshot must not wait on a sink the drain may be stuck in.
        if not self._drain_lock.acquire(blocking=False):
            return
        try:
            t_cpu = time.thread_time_ns()
            chunk = ring.drain_into(0, 0, [], -1, False)
            self.consumed += chunk[0]
            self._release_read(chunk[3])
            self._resolve(chunk, self.rec.clock)
            # Python work under the GIL, as a drain's slice is: the per-cycle figure counts it.
            self._cpu_acc += time.thread_time_ns() - t_cpu
            self._add_cpu_locked()
        finally:
            self._drain_lock.release()

    def drain(self) -> int:
        """Resolve every record whose events completed. Returns how many were resolved.

        In slices of about ``SLICE_NS`` of thread CPU each (one GIL hold), with a short sleep
        between slices so a worker waiting for the GIL gets it.
        """
        total = 0
        ring = self.rec.ring
        while True:
            limit = self.chunk
            with self._drain_lock:
                t_cpu = time.thread_time_ns()
                # The stretch under the GIL began where this thread last took it back (the
                # resolver's wait or sleep returned), or here for a call from elsewhere.
                in_run = threading.get_ident() == self._run_ident
                since = self._held_since
                start = since if since is not None and in_run else t_cpu
                nogil0 = getattr(ring, "nogil_ns", 0)
                taken_box = [0]
                cpu = 0
                try:
                    n = self._drain_locked(taken_box, limit)
                finally:
                    # Counted only now, after aggregation, sinks and accounting: force_flush()
                    # waits on this number, so it must not move before the data it stands for
                    # is visible -- and it must move even if something raised, or every later
                    # flush would wait its whole timeout for records that are gone.
                    t_end = time.thread_time_ns()
                    all_cpu = t_end - t_cpu
                    # What the native core walked with the GIL let go is no hold: a slice's
                    # CPU under the GIL is its CPU without the walks. Its holds are the
                    # stretches between two points where this thread let go of the GIL (a
                    # walk's start and end, a sleep, the wait for work; thread CPU clock): the
                    # one up to the first walk ends here, the one after the last walk at the
                    # next sleep or wait (``_release_point``).
                    cpu = max(0, all_cpu - (getattr(ring, "nogil_ns", 0) - nogil0))
                    walked = getattr(ring, "walk_count", 0) and ring.walk_cpu_out >= t_cpu
                    if not in_run:  # a call from another thread: the slice's own stretches
                        self._note_hold(max(ring.walk_cpu_out - t_cpu, t_end - ring.walk_cpu_in,
                                            ring.walk_hold_ns) if walked else cpu)
                    elif walked:
                        self._note_hold(ring.walk_cpu_out - start)
                        if ring.walk_hold_ns:
                            self._note_hold(ring.walk_hold_ns)
                        self._held_since = ring.walk_cpu_in
                    else:
                        self._held_since = start
                    self._cpu_pending += all_cpu  # added every 100 ms and at each flush
                    self.consumed += taken_box[0]
            self.slices += 1
            self._cpu_acc += cpu
            self.chunk = next_chunk(limit, n, cpu, self.slice_ns)
            if n < limit or not len(self.rec.ring):
                if not in_run:
                    self._add_cpu()  # the loop adds it with the thread times, every 100 ms
                self.drains += 1
                if self._flush_waiters:
                    with self._cond:
                        self._cond.notify_all()
                return total + n
            if self._flush_waiters:
                with self._cond:
                    self._cond.notify_all()
            total += n
            # A full slice and more to do: let a worker waiting for the GIL have it first.
            if in_run:
                self._release_point()
            time.sleep(self.yield_seconds)
            if in_run:
                self._held_since = time.thread_time_ns()

    def _add_cpu(self) -> None:
        """The resolver's thread CPU since the last call, into the aggregation (left to the
        holder of the drain lock when that is this very thread: a signal handler's call)."""
        if self._drain_lock.acquire():
            try:
                self._add_cpu_locked()
            finally:
                self._drain_lock.release()

    def _add_cpu_locked(self) -> None:
        """``_add_cpu`` with the drain lock held by the caller."""
        pending, self._cpu_pending = self._cpu_pending, 0
        pumped = getattr(self.rec.ring, "pump_ns", 0)
        pending += pumped - self._pump_seen  # the pump's CPU: the GIL let go throughout
        self._pump_seen = pumped
        if pending:
            self.agg.add_cpu("resolver", pending / 1e9)
        # The worker's time in CUDA acceptance copies (the runtime calls the ring makes, or the
        # clock's copy through torch): specobs's work, on the engine's own thread.
        copied = self.rec.copy_ns
        if copied > self._copy_added:
            self.agg.add_cpu("acceptance_copy", (copied - self._copy_added) / 1e9)
            self._copy_added = copied

    def _note_hold(self, hold: int) -> None:
        """One stretch of this thread's work with the GIL held (thread CPU ns)."""
        if hold > self.max_hold_ns:
            self.max_hold_ns = hold
        if hold > 100_000:
            self.long_holds += 1
        self.holds.append(hold)

    def _release_point(self) -> None:
        """The thread is about to let go of the GIL (sleep, wait): the stretch since it last
        took it back ends here."""
        since = self._held_since
        if since is not None:
            self._note_hold(time.thread_time_ns() - since)
            self._held_since = None

    def _drain_locked(self, taken_box: list[int], chunk: int) -> int:
        """Poll, read, validate, bucket and apply one chunk of the ring; hand it to the sinks.

        ``taken_box[0]`` is set to the cycles taken off the ring as soon as they are taken, so
        the caller can account for them whatever happens next.
        """
        rec = self.rec
        ring = rec.ring
        clock = rec.clock
        ring.expire(self.settle_timeout_ns)  # deferred cycles nobody settled: on, unsettled
        for ev, copy in ring.take_dropped():
            self._release(ev, copy)
        if clock is not self._native_events:
            self._read_events_natively(ring, clock)
        bound = self._poll(ring, clock, chunk)
        trace = self._trace_indices(bound)
        # Into the ring's running totals (the aggregation's snapshot reads them): only the
        # cycles that need Python come back as details.
        chunk_out = ring.drain_into(bound, chunk, trace,
                                    -1 if self.slow_ns is None else self.slow_ns,
                                    self.want_cycles)
        n: int = chunk_out[0]
        taken_box[0] = n
        self._release_read(chunk_out[3])
        if n and not chunk_out[2]:
            # The common chunk, inline: nothing for Python, nothing new to fold, no GPU-timed
            # cycle read, the sampler not due -- its figures gathered, nothing else. This is the
            # first Python after the walk, on caches the walk emptied: each call and attribute
            # here costs the GIL's hold several times its warm cost (benchmarks/diag/
            # hold_floor.py), so the common chunk makes as few as it can.
            counts = ring.counters()
            if ((counts, rec.changes) == self._fold_seen and counts[3:] == self._native_seen
                    and _perf() < self._adapt_due):
                pending = self._adapt_pending
                pending[2] += chunk_out[1]
                pending[3] += n
                return n
        try:
            out = self._resolve(chunk_out, clock)
        except Exception as exc:
            # A bug, not bad input (bad values are validated per cycle before anything is
            # applied): the chunk is lost as a whole and counted, never half-applied.
            # The ring counted every cycle's host times (and what it validated itself) already;
            # what is lost is the part that needed Python: one drop per such cycle.
            lost = len(chunk_out[2])
            _log.exception("specobs: resolver error; the GPU times, acceptance and traces of %d "
                           "cycles dropped: %r", lost, exc)
            for d in chunk_out[2]:
                self._release(d.events, d.copy)
            self.agg.count({"resolver_error": lost}, {"internal": 1})
            return n
        if out:
            for sink in self.sinks:
                try:
                    sink.on_cycles(out)
                except BaseException as exc:
                    # Whatever a sink raises -- SystemExit from a library's sys.exit(),
                    # KeyboardInterrupt, CancelledError -- is the sink's failure, not a reason
                    # for this thread to end: those cycles are missing from that sink alone.
                    rec.misuse("sink_error", _sink_failed(sink, exc))
        return n

    # -- the stages ------------------------------------------------------------------------------
    def _poll(self, ring: Any, clock: Any, chunk: int) -> int:
        """Stage 1, poll: the index bound below which the first ``chunk`` waiting cycles have
        completed on the GPU (every cycle, when nothing holds an event).

        Only cycles holding events (GPU-sampled, or with a CUDA acceptance copy) are looked
        at. On one stream, events complete in the order they were recorded, so the completed
        cycles are a prefix: the ring's ``poll`` finds its end from the copies' values landing
        over the sentinel, and by a binary search over the events (log2(n) queries instead of
        one a cycle), in one native call. Across streams, every event is asked in order."""
        query = clock.query if clock is not None else None
        if not getattr(clock, "stream_switched", False):
            return int(ring.poll(chunk, query, IN_FLIGHT_POLLS_BEFORE_QUERY))
        held, bound = ring.pending(chunk)
        if not held or query is None:
            return int(bound)
        if getattr(ring, "fence_every", 1) > 1:
            ring.fence_every = 1  # on several streams every copy records its event from now
        for j, h in enumerate(held):
            ev = h[1]
            if ev is not None and not query(ev[-1]):
                return int(h[0])
            c = h[2]
            if c is None or (query(c.event) if c.fenced else c.landed()):
                continue
            # An unfenced copy whose values never land over the sentinel (negative counts):
            # taken as complete once a later fenced copy completed.
            later = next((x[2] for x in held[j + 1:] if x[2] is not None and x[2].fenced), None)
            if later is None or not query(later.event):
                return int(h[0])
        return int(bound)

    def _read_events_natively(self, ring: Any, clock: Any) -> None:
        """Have the ring read sampled cycles' GPU times itself, through the runtime's functions
        the clock hands over once its direct path was checked on this thread (``None`` before):
        those cycles then need no Python and are drained with the GIL let go."""
        set_native = getattr(ring, "set_native_events", None)
        if set_native is None:
            return
        args = getattr(clock, "native_event_args", lambda: None)() if clock is not None else None
        if args is not None:
            set_native(*args)
            self._native_events = clock
            # The pump parks the event lists it read until it comes back: a quarter of the
            # clock's pool at most, so the worker never finds it dry meanwhile.
            events = getattr(clock, "pool_events", 0)
            ring.park_events = max(1, min(512, events // (self.rec.nphases + 1) // 4))
            # Every pooled event's handle now, once: the pump finds each sampled cycle's
            # handles in the ring's cache from the first cycles on (else it comes back for
            # each cycle drawing events never seen, until the pool went round once).
            idle = getattr(clock, "idle_events", None)
            if idle is not None:
                ring.cache_handles(idle())
        elif self._native_events is not None:
            set_native()  # the clock it read for is gone (dropped at fork, replaced)
            self._native_events = None

    def _native_gpu(self, counts: tuple[int, ...]) -> tuple[int, int]:
        """Sampled cycles whose GPU times the ring read itself since the last call, and the
        worker's ns recording their events (``counts``: the ring's ``counters()``)."""
        now = (counts[3], counts[4])
        seen = self._native_seen
        if now == seen:
            return 0, 0
        self._native_seen = now
        return now[0] - seen[0], now[1] - seen[1]

    def _trace_indices(self, bound: int) -> list[int]:
        """Head sampling: the cycle indices below ``bound`` picked for traces, one draw per
        traced cycle (geometric gaps), not one per cycle."""
        if not self.want_traces or self.head_rate <= 0.0:
            return []
        nxt = self._next_trace
        out: list[int] = []
        while nxt < bound:
            out.append(nxt)
            nxt += 1 + sampling.geometric_gap(self._rng.random(), self.head_rate)
        self._next_trace = nxt
        return out

    def _release_read(self, released: list[Any]) -> None:
        """What a drain read itself (``drain_into``'s last item): copies from pinned memory back
        to their pool, the event lists of the sampled cycles whose GPU times it read back to the
        clock."""
        for x in released:
            if type(x) is list:
                self._release(x, None)
            else:
                self._release(None, x)

    def _release(self, ev: Any, copy: Any) -> None:
        clock = self.rec.clock
        if ev is not None and clock is not None:
            clock.release(ev)
        if copy is not None:
            try:
                copy.release()
            except Exception:
                pass

    def _resolve(self, chunk: Any, clock: Any) -> list[ResolvedCycle]:
        """Stages 2-4 for the cycles the ring handed over as details -- read (GPU times, CUDA
        copies), validate (what the ring kept as objects) -- then stage 5, apply: one call into
        the aggregation with validated numbers only, so a chunk is applied whole or not at all.
        Every cycle's host times, and the acceptance and batch sizes the ring counted itself,
        are in the ring's running totals already (``drain_into``), which the aggregation's
        snapshot reads. Returns the cycles the sinks should see."""
        n, total_ns, details, _released = chunk
        agg = self.agg
        rec = self.rec
        counts = rec.ring.counters()
        if not n:
            agg.count(*self._fold(counts))
            return []
        # Sampled cycles the ring read itself: their records count against the budget; their
        # reads do not (made with the GIL let go, they cost the worker nothing).
        n_native, native_cost = self._native_gpu(counts)
        if not details:  # the common case: nothing for Python but the sampler's figures
            dropped, errors = self._fold(counts)
            if dropped or errors:
                agg.count(dropped, errors)
            self._adapt_some(native_cost, n_native, total_ns, n, 0)
            return []
        nph = rec.nphases
        k_max = agg.max_draft_length
        gpu, cost, read_ns = self._read_gpu(details, clock)
        acceptance, py_batches, validated = self._validate(details, k_max)
        by_k = _by_draft_length(details, validated, k_max, nph, rec.misuse)
        # Folded after the validation, whose bad values are counted in this chunk's apply: a
        # flush that waits for a pass to end then sees them (folded before, they waited for
        # the next pass, which a flush had no reason to wait for).
        dropped, errors = self._fold(counts)
        batches: Bucketed | None = (
            _bucket(py_batches, catalog.BATCH_SIZE_BUCKETS, 1.0) if py_batches else None)
        gcols = list(gpu.values())
        gpu_phases: list[Bucketed] = []
        gpu_cycle: Bucketed | None = None
        if gcols:
            bounds = agg.duration_bounds
            gpu_phases = [_bucket([g[i] for g in gcols], bounds) for i in range(nph)]
            gpu_cycle = _bucket([sum(g) for g in gcols], bounds)
        out = self._resolved_cycles(details, gpu, validated, k_max)
        agg.apply(Chunk(  # grouped as Chunk documents its fields
            dropped=dropped, errors=errors,
            gpu_phases=gpu_phases, gpu_cycle=gpu_cycle,
            acceptance=acceptance, batch_sizes=batches,
            traced=[r for r in out if r.trace_id is not None],
            by_draft_length=by_k,
        ))
        self._adapt_some(cost + native_cost, len(gpu) + n_native, total_ns, n, read_ns)
        return out

    def _read_gpu(self, details: list[Detail], clock: Any) -> tuple[dict[int, list[int]], int, int]:
        """GPU phase times of the sampled cycles (every event of theirs has completed), by
        position in ``details``; the hot-path ns their records cost; the ns reading them took."""
        gpu: dict[int, list[int]] = {}
        cost = 0
        if clock is None:
            return gpu, cost, 0
        t_read = _perf()
        el = clock.elapsed_ns
        rec = self.rec
        for j, d in enumerate(details):
            ev = d.events
            if ev is None:
                continue
            try:
                g = [el(ev[i], ev[i + 1]) for i in range(len(ev) - 1)]
                if all(type(x) is int and x >= 0 for x in g):
                    gpu[j] = g
                else:
                    rec.log.warn("elapsed", "GPU event times are not integer nanoseconds; those "
                                 "cycles are counted without GPU times")
            except Exception as exc:
                rec.log.warn("elapsed", f"could not read GPU event times: {exc!r}")
            clock.release(ev)
            cost += d.cost_ns
        return gpu, cost, _perf() - t_read

    def _validate(
        self, details: list[Detail], k_max: int
    ) -> tuple[BatchAcceptance | None, list[int], Callable[[Any], Acceptance | None]]:
        """What the ring kept as objects, validated (:mod:`specobs._acceptance`): acceptance it
        did not store itself (copies read here first, so they are validated by columns too),
        and batch sizes it did not take. Returns the chunk's acceptance and batch sizes, and
        what a detail's resolved cycle shows (for the details validated here)."""
        recs: list[Record] = []
        position: dict[int, int] = {}  # id(detail) -> its record's position in ``recs``
        rec = self.rec
        for d in details:
            native = d.native
            acc, copy, b = d.acceptance, d.copy, d.batch
            bad_batch = b is not None and not (type(b) is int and 0 <= b <= _acceptance.MAX_BATCH)
            if native and not bad_batch:
                continue
            if native:  # counted already: only the batch size needs a verdict
                recs.append(Record(batch_size=b))
                continue
            if acc is None and copy is None and not bad_batch:
                continue
            if copy is not None:
                try:
                    acc = copy.read()
                except Exception as exc:
                    rec.misuse("bad_acceptance", _unread_copy(exc))
                    acc = None
            position[id(d)] = len(recs)
            recs.append(Record(acc, d.draft_length, d.emitted, b))
        if not recs:
            return None, [], lambda d: None
        found = batch_acceptance(recs, k_max, rec.misuse)

        def shown(d: Any) -> Acceptance | None:
            i = position.get(id(d))
            return None if i is None else resolved_acceptance(found, i, recs[i], k_max)

        return found.acceptance, found.batches, shown

    def _resolved_cycles(
        self, details: list[Detail], gpu: dict[int, list[int]],
        validated: Callable[[Any], Acceptance | None], k_max: int,
    ) -> list[ResolvedCycle]:
        """A :class:`ResolvedCycle` for each traced detail (and each one, when a sink wants all)."""
        need_all = self.want_cycles
        slow = self.slow_ns
        rng = self._rng
        anchor_wall = self.anchor.offset_ns
        phases = self.rec.phases
        nph = len(phases)
        out: list[ResolvedCycle] = []
        for j, d in enumerate(details):
            traced = bool(d.traced)
            g = gpu.get(j)
            if slow is not None and g is not None and sum(g) >= slow:
                traced = True
            if not (need_all or traced):
                continue
            ts = d.stamps
            b = d.batch
            batch = b if type(b) is int and 0 <= b <= _acceptance.MAX_BATCH else None
            a: Acceptance | None = None
            if d.native:
                lens = d.acceptance
                k = d.draft_length
                s = sum(lens)
                a = Acceptance(lens, s, k * len(lens), s + len(lens), (k, len(lens)))
            else:
                a = validated(d)
            counted: dict[str, Any] = {}
            if a is not None:
                counted = {"drafted": a.drafted, "accepted": a.accepted, "emitted": a.emitted,
                           "accept_lengths": list(a.lengths), "drafted_shape": a.shape}
                if batch is None:
                    batch = len(a.lengths)
            ids: dict[str, Any] = {}
            if traced:
                ids = {"trace_id": rng.getrandbits(128) or 1, "span_id": rng.getrandbits(64) or 1,
                       "phase_span_ids": [rng.getrandbits(64) or 1 for _ in range(nph)]}
            out.append(ResolvedCycle(
                index=d.cycle_index, phases=phases, start_wall_ns=anchor_wall + ts[0],
                end_wall_ns=anchor_wall + ts[-1], host_ns=[ts[i + 1] - ts[i] for i in range(nph)],
                gpu_ns=g, batch_size=batch, **counted, **ids))
        return out

    def _drops_now(self, counts: tuple[int, ...]) -> dict[str, int]:
        """Every drop reason the recorder and its ring count, at its running total (``counts``:
        the ring's ``counters()``): what :meth:`_fold` takes the differences of."""
        rec = self.rec
        return {
            "event_pool_exhausted": rec.dropped_pool,
            "graph_capture": rec.dropped_capture,
            "misuse": counts[0],
            "queue_full": counts[1],
            "unsettled": counts[2],
            catalog.DROP_REASON_EXCEPTION: counts[5],
        }

    def _fold(self, counts: tuple[int, ...]) -> tuple[dict[str, int], dict[str, int]]:
        """What the recorder counted since the last fold: drops by reason, errors by kind.
        ``counts``: the ring's ``counters()``, read once per chunk with the sampler's figures.
        Its Python-side counts (errors, the clock's drops) move ``rec.changes``: the common
        chunk, with nothing new, compares one tuple and builds nothing."""
        rec = self.rec
        seen = (counts, rec.changes)
        if seen == self._fold_seen:
            return _NOTHING, _NOTHING
        self._fold_seen = seen
        dropped: dict[str, int] = {}
        for key, value in self._drops_now(counts).items():
            prev = self._folded.get(key, 0)
            if value != prev:
                dropped[key] = value - prev
                self._folded[key] = value
        errors: dict[str, int] = {}
        for kind, value in list(rec.errors.items()):
            key = "err:" + kind
            prev = self._folded.get(key, 0)
            if value != prev:
                errors[kind] = value - prev
                self._folded[key] = value
        return dropped, errors

    def _adapt_some(self, cost: int, n_sampled: int, total_ns: int, n: int, read_ns: int) -> None:
        """One chunk's figures for the sampler, which runs on what gathered since it last ran
        once ADAPT_EVERY_NS passed (a slice's Python is what holds the GIL: its bookkeeping is
        paid a few times a second, not once a slice)."""
        p = self._adapt_pending
        p[0] += cost
        p[1] += n_sampled
        p[2] += total_ns
        p[3] += n
        p[4] += read_ns
        now = _perf()
        if now < self._adapt_due:
            return
        self._adapt_due = now + ADAPT_EVERY_NS
        self._adapt_pending = [0, 0, 0, 0, 0]
        self._adapt(p[0], p[1], p[2] / p[3] if p[3] else 0.0, p[4])

    def _adapt(self, cost: int, n_sampled: int, mean_cycle: float, read_ns: int = 0) -> None:
        """Update the sampling interval and the self-reported overhead from one chunk.

        A sampled cycle costs the worker its event records (``cost``, measured on the hot
        path) and the resolver's reads of its events (``read_ns``): the resolver shares the
        GIL with the worker, and inside a GPU loop each CUDA runtime call costs it several
        microseconds (benchmarks/RESULTS.md, issue 15), a sampled cycle 20-30 µs in all, more
        than its records. Both count against the budget.
        """
        rec = self.rec
        # Per cycle that ended, not per record a slice took: the native core's pump hands most
        # cycles on with the GIL let go, so a slice that took a few (a flush's, a scrape's)
        # made its fixed cost a per-record figure that read 26% of a 0.21 ms cycle on the
        # H200, where the resolver's exported CPU came to 0.3%. Gathered over enough cycles
        # that one slice is not a spike.
        ended = rec.enqueued - self._cpu_acc_cycles_from
        now = _perf()
        if ended >= RESOLVER_FIGURE_CYCLES or (
                ended > 0 and now - self._cpu_acc_since >= RESOLVER_FIGURE_NS):
            self._record_ns = sampling.smoothed(self._record_ns, self._cpu_acc / ended)
            self._cpu_acc = 0
            self._cpu_acc_cycles_from = rec.enqueued
            self._cpu_acc_since = now
        self._cycle_ewma = sampling.smoothed(self._cycle_ewma, mean_cycle)
        cycles = rec.enqueued - self._enqueued_seen
        if cycles > 0:
            copy_ns = rec.copy_ns
            per_copy = (copy_ns - self._copy_seen) / cycles
            self._copy_ewma = sampling.smoothed(self._copy_ewma, per_copy) if per_copy else (
                self._copy_ewma * 0.8)
            self._copy_seen = copy_ns
            self._enqueued_seen = rec.enqueued
        if n_sampled:
            self._cost_ewma = sampling.smoothed(self._cost_ewma, cost / n_sampled)
            self._read_ewma = sampling.smoothed(self._read_ewma, read_ns / n_sampled)
        if rec.sample_every is None and self._cost_ewma > 0:
            rec.interval = sampling.adaptive_interval(
                self._cost_ewma + self._read_ewma, self._cycle_ewma, self.budget
            )
        overhead: float | None = None
        if self._cycle_ewma > 0:
            # What the worker loses per cycle: event records on sampled cycles (measured on the
            # hot path), host stamps (an estimate per boundary), and the resolver's CPU per
            # cycle while it holds the GIL, which the worker shares (what the native core
            # walks with the GIL let go is not counted: the worker runs meanwhile). CUDA
            # acceptance copies the native core starts hold the GIL through two runtime calls:
            # their measured time on the worker (``_copy_ewma``) is the worker's own, and counts.
            # Copies through torch (the Python path) let go of the GIL inside, and most of
            # their wall time is waiting to get it back from the resolver, which its term
            # counts already -- added, the gauge read 2-4x the measured loss on the H200
            # (benchmarks/RESULTS.md, issue 15).
            native_copies = getattr(rec.ring, "native_copies", 0) > 0
            per_cycle = (
                self._cost_ewma / max(rec.interval, 1)
                + rec.boundary_ns * (rec.nphases + 1)
                + self._record_ns
                + (self._copy_ewma if native_copies else 0.0)
            )
            overhead = per_cycle / self._cycle_ewma
        self.agg.set_sampling(rec.interval, overhead, cost / 1e9 if n_sampled else 0.0)


#: How often the sampler re-reads its figures (ns): each run is ~10 µs of Python with the GIL
#: held; gathered over this long, the figures are steadier too.
ADAPT_EVERY_NS = 20_000_000
#: The resolver's CPU per cycle is read over at least this many cycles, or this long when
#: cycles are slow.
RESOLVER_FIGURE_CYCLES = 256
RESOLVER_FIGURE_NS = 1_000_000_000

#: What ``_fold`` returns when nothing changed (never written to).
_NOTHING: dict[str, int] = {}

#: Polls a copy may be first in line, in flight by its sentinel, before the poll also asks the
#: driver about the events after it (what settles a copy whose values never land).
IN_FLIGHT_POLLS_BEFORE_QUERY = 4


#: How long past its deadline a sink call may take before it is left behind: a sink that honours
#: its timeout returns at about the deadline (finishing an export it cut short, closing a
#: socket), and must not be mistaken for one that hangs. The bound of ``force_flush`` /
#: ``shutdown`` is their timeout plus this, per call.
SINK_CALL_GRACE_SECONDS = 0.2


def _by_draft_length(
    details: list[Detail], validated: Callable[[Any], Acceptance | None], k_max: int, nph: int,
    report: Callable[[str, str], None],
) -> ByDraftLength | None:
    """What the details add by draft length that the ring could not count itself (see
    :attr:`Detail.cycle_k`): the cycles it could not place -- ``begin``'s draft length kept as
    an object (validated here: a bad one is counted as ``bad_draft_length``, the cycle kept
    without a k), or none from ``begin`` and acceptance validated here (its draft length as
    ``accept`` named it) -- with their host phase times, emitted tokens and batch sizes; and the
    emitted tokens and batch sizes validated here of cycles it placed. ``None``: nothing."""
    kc: dict[int, int] = {}
    kh: dict[int, list[int]] = {}
    ke: dict[int, int] = {}
    kb: dict[int, int] = {}
    for d in details:
        ck = d.cycle_k
        if ck == -1:
            continue  # no k
        a = None if d.native else validated(d)
        batch, by_ring = _cycle_batch(d, a)
        if ck >= 0:  # placed by the ring: only what was validated here is left
            if a is not None:
                ke[ck] = ke.get(ck, 0) + a.emitted
            if batch is not None and not by_ring:
                kb[ck] = kb.get(ck, 0) + batch
            continue
        obj = d.cycle_k_obj
        if obj is not None:
            k = _acceptance.draft_length_of(obj, k_max)
            if k is None:
                report("bad_draft_length", f"begin(draft_length=) must be an int between 0 and "
                       f"max_draft_length={k_max}, got {short_repr(obj)}; the cycle is kept "
                       f"without a draft length")
                continue
        else:
            k = _acceptance.cycle_draft_length(d.draft_length, a)
            if k is None:
                continue
        kc[k] = kc.get(k, 0) + 1
        add_stamps_by_k(kh, k, d.stamps, nph)
        if d.native:
            lens = d.acceptance
            ke[k] = ke.get(k, 0) + sum(lens) + len(lens)
        elif a is not None:
            ke[k] = ke.get(k, 0) + a.emitted
        kb[k] = kb.get(k, 0) + (batch or 0)
    if not kc and not ke and not kb:
        return None
    return kc, kh, ke, {}, kb


def _cycle_batch(d: Detail, a: Acceptance | None) -> tuple[int | None, bool]:
    """A detail's batch size as the batch-size histogram counts it (``None``: none), and whether
    the ring counted it (a valid int given, or the sequences of acceptance it stored) rather than
    the resolver's validation (as :meth:`Resolver._validate` chooses: anything else given, or
    the sequences of acceptance validated here, ``a``)."""
    b = d.batch
    given_ok = b is None or (type(b) is int and 0 <= b <= _acceptance.MAX_BATCH)
    if given_ok and (d.native or (d.acceptance is None and d.copy is None)):
        if b is not None:
            return b, True
        return (len(d.acceptance) if d.native else None), True
    if b is not None:
        return _acceptance.batch_size_of(b), False
    return (len(a.lengths) if a is not None else None), False


def _call_sinks(sinks: Sequence[Sink], method: str, deadline: float) -> list[object]:
    """``sink.<method>(remaining seconds)`` for every sink, each on a daemon thread, all at once,
    joined until ``deadline`` plus :data:`SINK_CALL_GRACE_SECONDS`.

    A sink's ``force_flush`` and ``shutdown`` must return within their timeout (``Sink``'s
    contract), but a custom sink that blocks would otherwise hang ``shutdown()`` and the
    interpreter's exit with it, and one slow sink would take the time of those after it.
    Returns, per sink, what the call returned, ``False`` when it raised, and ``None`` when it
    had not returned in time (logged; its thread is left behind, a daemon).
    """
    results: list[list[object]] = [[] for _ in sinks]

    def call(sink: Sink, out: list[object]) -> None:
        try:
            out.append(getattr(sink, method)(max(0.0, deadline - time.monotonic())))
        except Exception as exc:
            _log.warning("specobs: sink %r %s failed: %r", sink, method, exc)
            out.append(False)

    threads = [
        threading.Thread(target=call, args=(sink, out), name=f"specobs-sink-{method}", daemon=True)
        for sink, out in zip(sinks, results, strict=True)
    ]
    for t in threads:
        t.start()
    until = max(deadline, time.monotonic()) + SINK_CALL_GRACE_SECONDS
    for t in threads:
        t.join(max(0.0, until - time.monotonic()))
    for sink, out in zip(sinks, results, strict=True):
        if not out:
            _log.warning(
                "specobs: sink %r did not return from %s within its timeout; going on without it",
                sink, method,
            )
    return [out[0] if out else None for out in results]
