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

The resolver keeps the thread and the order of work. Each concern with state of its own is a
part it owns: the stages and trace selection (:mod:`specobs._stages`), the sampler's model
(:mod:`specobs._overhead`), drop folding (:mod:`specobs._fold`), and the slicing policy with the
hold meter benchmarks attach (:mod:`specobs._holds`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import specobs._stages as _stages
import specobs.catalog as catalog
from specobs._aggregation import Chunk
from specobs._bucketing import Bucketed
from specobs._fold import Folder
from specobs._holds import CHUNK, DEFAULT_TUNING, HoldMeter, NullMeter, Tuning, next_chunk
from specobs._model import ResolvedCycle
from specobs._overhead import Counts, CpuLedger, OverheadModel
from specobs._recorder import short_repr
from specobs._ring_protocol import PumpingRing
from specobs._signalsafe import GuardedLock, Reentered, Wakeup
from specobs._sinkcalls import call_sinks, hand_on

if TYPE_CHECKING:
    from specobs._aggregation import Aggregation
    from specobs._recorder import Recorder
    from specobs.sinks._base import Sink
    from specobs.timing import WallAnchor

__all__ = ["Resolver"]

#: How often the resolver reads the recording thread's CPU and wait times (one small /proc
#: file; every snapshot reads it too).
THREAD_TIME_READ_SECONDS = 0.1
#: Pause before the resolver's loop starts again after an exception ended it.
RESTART_PAUSE_SECONDS = 0.05

_log = logging.getLogger("specobs")
_perf = time.perf_counter_ns


def _restarted(exc: BaseException) -> Callable[[], str]:
    """The message for a resolver loop that ended by an exception, built only if logged."""
    return lambda: (f"the resolver thread ended by {short_repr(exc, 200)}; started again "
                    f"(nothing it had aggregated is lost)")


class Resolver:
    """Owns the background thread of one observer, and the order of its work."""

    #: How long a cycle ended by ``defer()`` waits for its ``settle()`` (ring clock ns); the
    #: observer sets it from ``settle_timeout_seconds``.
    settle_timeout_ns = 5_000_000_000

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
        #: Every cycle resolved for the sinks (a sink wants them all): never through the pump.
        self.want_cycles = want_cycles
        self.name = name
        #: Records the next slice may take (:func:`specobs._holds.next_chunk` sizes it).
        self.chunk = CHUNK
        #: Whether the ring has the native pump; a ring's kind never changes.
        self.pumps = isinstance(recorder.ring, PumpingRing)
        slow = trace_slow_cycle_seconds
        self.traces = _stages.Traces(want_traces, trace_head_rate,
                                     None if slow is None else int(slow * 1e9))
        self.native = _stages.NativeReads()
        self.model = OverheadModel(overhead_budget, _perf())
        self.folder = Folder()
        self.cpu = CpuLedger()
        #: The knobs and the hold meter a benchmark sets (:meth:`tune`).
        self.tuning: Tuning = DEFAULT_TUNING
        self.meter: HoldMeter = NullMeter()
        self._init_sync_state()

    def _init_sync_state(self) -> None:
        self.consumed = 0  # cycles taken off the ring by the resolver
        self.drains = 0  # completed drain passes (force_flush waits for one that began later)
        # Set by the worker's end() and by force_flush(), from signal handlers too: a set()
        # that takes no lock Python code holds (see specobs/_signalsafe.py).
        self._wake = Wakeup()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._flush_waiters = 0  # force_flush calls waiting on _cond
        self._run_ident = 0  # the resolver's thread while it runs its loop
        self._drain_lock = GuardedLock()  # never waited for by the thread that holds it
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        t = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread = t
        t.start()

    def tune(self, tuning: Tuning | None = None, meter: HoldMeter | None = None) -> HoldMeter:
        """For benchmarks and tests: other knobs, or a meter of the GIL holds. New knobs take
        effect from the thread's next wake-up, which this brings on; a meter counts from the
        next hold. Returns the meter."""
        if meter is not None:
            self.meter = meter
        if tuning is not None:
            self.tuning = tuning
            self.wake()
        return self.meter

    def after_fork_in_child(self, *, start: bool = True) -> None:
        """Rebuild locks and the thread, and start the child's totals from zero.

        The parent's records (queued or already aggregated) are the parent's: it resolves and
        exports them itself. The child's aggregation starts empty with a new creation time, so
        a child exporting by OTLP never re-reports the parent's cycles; the records the parent
        had queued are dropped here and counted as ``dropped{reason="fork"}``.
        """
        rec = self.rec
        ring = rec.ring
        lost = ring.clear_queue()
        ring.forget_current()
        ring.take_dropped()  # the parent's events: not this process's to release
        self._init_sync_state()
        self.traces.reset(rec.begun)
        self.consumed = rec.enqueued - rec.dropped_queue_full
        self.agg.after_fork_in_child()
        # What the recorder counted before the fork belongs to the parent: from here on.
        self.folder.rebase(rec, ring.counters())
        self.model.reset(rec.enqueued, rec.copy_ns)
        self.cpu.reset(rec.copy_ns)
        self.meter.reset()
        self.agg.count_dropped("fork", lost)
        if start:
            self.start()

    def wake(self) -> None:
        self._wake.set()
        if self.pumps:
            self.rec.ring.pump_wake()

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
        self.meter.took_back()
        while not self._stop.is_set():
            clock = self.rec.clock
            if clock is not bound and clock is not None:
                bound = clock
                _bind_thread(clock)
            self.meter.release_point()
            self._wait(clock)
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

    def _wait(self, clock: Any) -> None:
        """Wait for work: inside the native pump where it can run, else on the wake-up."""
        ring = self.rec.ring
        if (self.pumps and self.tuning.use_pump and not self.want_cycles
                and not getattr(clock, "stream_switched", False)):
            # The steady state in C: waits, polls and walks with the GIL let go, back here
            # only for what needs Python (see Ring.pump).
            slow = self.traces.slow_ns
            why = ring.pump(
                int(self.poll * 1e9),
                self.traces.head_next(),
                -1 if slow is None else slow,
                self.settle_timeout_ns,
                # No periodic return: what the resolver's Python does besides the cycles that
                # need it (the sampler's figures, counts made in Python, its CPU), the export
                # path does before each snapshot (``catch_up``).
                -1,
            )
            self.meter.took_back(ring.pump_cpu_in)
            self.meter.pump_returned(why)
        else:
            self._wake.wait(self.poll)
            self.meter.took_back()

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
        return all(bool(r) for r in call_sinks(self.sinks, "force_flush", deadline))

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
        call_sinks(self.sinks, "shutdown", deadline)

    # -- the work --------------------------------------------------------------------------------
    def catch_up(self) -> None:
        """Before a snapshot, on the export path's thread: while the pump keeps the resolver's
        thread in C, what its Python would have done by now -- the cycles the pump walked
        handed over (``force_flush``'s count, the sampler's figures), the references it parked
        handed back, counts made in Python folded in, its CPU added. Walks nothing (the pump
        lets go of the ring for the one call that takes these, and goes on). Nothing when the
        resolver's own loop is not pumping."""
        ring = self.rec.ring
        if not (self.pumps and ring.pumping) or threading.get_ident() == self._run_ident:
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
            self.model.add_cpu(time.thread_time_ns() - t_cpu)
            self._add_cpu_locked()
        finally:
            self._drain_lock.release()

    def drain(self) -> int:
        """Resolve every record whose events completed. Returns how many were resolved.

        In slices of about ``Tuning.slice_ns`` of thread CPU each (one GIL hold), with a short
        sleep between slices so a worker waiting for the GIL gets it.
        """
        total = 0
        ring = self.rec.ring
        while True:
            limit = self.chunk
            with self._drain_lock:
                t_cpu = time.thread_time_ns()
                in_run = threading.get_ident() == self._run_ident
                nogil0 = ring.nogil_ns
                taken = [0]
                try:
                    n = self._drain_locked(taken, limit)
                finally:
                    # force_flush() waits on ``consumed``: it moves only now, after the
                    # aggregation, the sinks and the CPU accounting saw the chunk, and it moves
                    # even if something raised, or every later flush would wait its whole
                    # timeout for records that are gone.
                    t_end = time.thread_time_ns()
                    self.cpu.pending += t_end - t_cpu  # added every 100 ms and at each flush
                    self.consumed += taken[0]
                # What the native core walked with the GIL let go is no hold: the slice's CPU
                # under the GIL is its CPU without the walks.
                cpu = max(0, t_end - t_cpu - (ring.nogil_ns - nogil0))
                self.meter.slice_done(ring, t_cpu, t_end, cpu, in_run)
            self.model.add_cpu(cpu)
            self.chunk = next_chunk(limit, n, cpu, self.tuning.slice_ns)
            if n < limit or not len(self.rec.ring):
                if not in_run:
                    self._add_cpu()  # the loop adds it with the thread times, every 100 ms
                self.drains += 1
                self._notify_flush()
                return total + n
            self._notify_flush()
            total += n
            # A full slice and more to do: let a worker waiting for the GIL have it first.
            if in_run:
                self.meter.release_point()
            time.sleep(self.tuning.yield_seconds)
            if in_run:
                self.meter.took_back()

    def _notify_flush(self) -> None:
        """Wake the ``force_flush`` calls waiting (the condition is taken only when some do)."""
        if self._flush_waiters:
            with self._cond:
                self._cond.notify_all()

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
        ring = self.rec.ring
        resolver_ns, copy_ns = self.cpu.take(ring.pump_ns if self.pumps else 0, self.rec.copy_ns)
        if resolver_ns:
            self.agg.add_cpu("resolver", resolver_ns / 1e9)
        if copy_ns:
            self.agg.add_cpu("acceptance_copy", copy_ns / 1e9)

    def _drain_locked(self, taken: list[int], chunk: int) -> int:
        """Poll, read, validate, bucket and apply one chunk of the ring; hand it to the sinks.

        ``taken[0]`` is set to the cycles taken off the ring as soon as they are taken, so the
        caller can account for them whatever happens next.
        """
        rec = self.rec
        ring = rec.ring
        clock = rec.clock
        ring.expire(self.settle_timeout_ns)  # deferred cycles nobody settled: on, unsettled
        for ev, copy in ring.take_dropped():
            self._release(ev, copy)
        if clock is not self.native.clock:
            self.native.bind(ring, clock, rec.nphases)
        bound = _stages.poll(ring, clock, chunk)
        traces = self.traces
        # Into the ring's running totals (the aggregation's snapshot reads them): only the
        # cycles that need Python come back as details.
        chunk_out = ring.drain_into(bound, chunk, traces.pick(bound),
                                    -1 if traces.slow_ns is None else traces.slow_ns,
                                    self.want_cycles)
        n: int = chunk_out[0]
        taken[0] = n
        self._release_read(chunk_out[3])
        if n and not chunk_out[2]:
            # The common chunk, inline: nothing for Python, nothing new to fold, no GPU-timed
            # cycle read, the sampler not due -- its figures gathered, nothing else. This is the
            # first Python after the walk, on caches the walk emptied, so it makes as few calls
            # and attribute reads as it can (benchmarks/diag/hold_floor.py measures them).
            counts = ring.counters()
            model = self.model
            if ((counts, rec.changes) == self.folder.seen and counts[3:] == self.native.seen
                    and _perf() < model.due):
                pending = model.pending
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
            hand_on(self.sinks, out, rec.misuse)
        return n

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
        """The stages for the cycles the ring handed over as details -- read (GPU times, CUDA
        copies), validate (what the ring kept as objects) -- then apply: one call into the
        aggregation with validated numbers only, so a chunk is applied whole or not at all.
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
        n_native, native_cost = self.native.take(counts)
        if not details:  # the common case: nothing for Python but the sampler's figures
            dropped, errors = self._fold(counts)
            if dropped or errors:
                agg.count(dropped, errors)
            self._adapt_some(native_cost, n_native, total_ns, n, 0)
            return []
        nph = rec.nphases
        k_max = agg.max_draft_length
        gpu, cost, read_ns = _stages.read_gpu(details, clock, rec)
        acceptance, py_batches, validated = _stages.validate(details, k_max, rec.misuse)
        by_k = _stages.by_draft_length(details, validated, k_max, nph, rec.misuse)
        # Folded after the validation, whose bad values are counted in this chunk's apply: a
        # flush that waits for a pass to end then sees them.
        dropped, errors = self._fold(counts)
        batches: Bucketed | None = (
            _stages.bucket(py_batches, catalog.BATCH_SIZE_BUCKETS, 1.0) if py_batches else None)
        gcols = list(gpu.values())
        gpu_phases: list[Bucketed] = []
        gpu_cycle: Bucketed | None = None
        if gcols:
            bounds = agg.duration_bounds
            gpu_phases = [_stages.bucket([g[i] for g in gcols], bounds) for i in range(nph)]
            gpu_cycle = _stages.bucket([sum(g) for g in gcols], bounds)
        out = _stages.resolved_cycles(details, gpu, validated, phases=rec.phases,
                                      anchor_ns=self.anchor.offset_ns,
                                      want_all=self.want_cycles, traces=self.traces)
        agg.apply(Chunk(  # grouped as Chunk documents its fields
            dropped=dropped, errors=errors,
            gpu_phases=gpu_phases, gpu_cycle=gpu_cycle,
            acceptance=acceptance, batch_sizes=batches,
            traced=[r for r in out if r.trace_id is not None],
            by_draft_length=by_k,
        ))
        self._adapt_some(cost + native_cost, len(gpu) + n_native, total_ns, n, read_ns)
        return out

    def _fold(self, counts: tuple[int, ...]) -> tuple[dict[str, int], dict[str, int]]:
        """What the recorder counted since the last fold (:meth:`Folder.take`); deferred cycles
        handed on unsettled are also logged."""
        dropped, errors = self.folder.take(self.rec, counts)
        unsettled = dropped.get("unsettled")
        if unsettled:
            self.rec.log.warn("unsettled", self._unsettled_message(unsettled))
        return dropped, errors

    def _unsettled_message(self, n: int) -> Callable[[], str]:
        """The line for deferred cycles handed on (or dropped) without a ``settle()``."""
        timeout = self.settle_timeout_ns / 1e9
        backlog = self.rec.ring.settle_backlog
        return lambda: (
            f"{n} deferred cycle(s) never settled: each is handed on after "
            f"settle_timeout_seconds={timeout:g}, or once {backlog} cycles wait behind it, or at "
            f"shutdown, with its times and without its tokens "
            f"(dropped_records{{reason=\"unsettled\"}}); expected a settle() for every defer() "
            f"(a settling thread that died, or a result that never came back)")

    def _adapt_some(self, cost: int, n_sampled: int, total_ns: int, n: int, read_ns: int) -> None:
        """One chunk's figures for the sampler, which runs on what gathered since it last ran
        once it is due (:meth:`OverheadModel.gather`)."""
        due = self.model.gather(cost, n_sampled, total_ns, n, read_ns, _perf())
        if due is not None:
            self._adapt(*due)

    def _adapt(self, cost: int, n_sampled: int, mean_cycle: float, read_ns: int = 0) -> None:
        """Run the sampler's model on figures gathered, and apply what it answers: the sampling
        interval, and the self-reported overhead."""
        rec = self.rec
        counts = Counts(rec.enqueued, rec.copy_ns, rec.interval, rec.sample_every is None,
                        rec.boundary_ns, rec.nphases, getattr(rec.ring, "native_copies", 0) > 0)
        reading = self.model.run(cost, n_sampled, mean_cycle, read_ns, counts, _perf())
        if reading.interval is not None:
            rec.interval = reading.interval
        self.agg.set_sampling(rec.interval, reading.overhead, reading.cost_seconds)


def _bind_thread(clock: Any) -> None:
    """A CUDA clock reads its events through the runtime directly on the resolver's thread (one
    call per phase instead of torch's five, with the GIL released): bind it to this thread."""
    bind = getattr(clock, "bind_thread", None)
    if bind is not None:
        try:
            bind()
        except Exception as exc:
            _log.info("specobs: could not bind the resolver to the clock: %r", exc)
