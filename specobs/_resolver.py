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
import operator
import random
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence, Set
from itertools import repeat, starmap
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from specobs import sampling
from specobs._aggregation import Exemplar

if TYPE_CHECKING:
    from specobs._aggregation import Aggregation
    from specobs._recorder import Cycle, Recorder
    from specobs.sinks import Sink
    from specobs.timing import WallAnchor

__all__ = ["ResolvedCycle", "Resolver"]

#: Records resolved in the first GIL hold of a new resolver; after that the count follows the
#: measured length of each hold (see ``drain``): doubled after a full slice under half of
#: ``SLICE_NS``, shrunk in proportion after one over it, within ``MIN_CHUNK``..``MAX_CHUNK``.
CHUNK = 32
#: Thread CPU one hold of the GIL aims at. The worker shares the GIL: a worker whose GPU sync
#: returns while the resolver holds it waits for the rest of the hold, so holds are bounded by
#: time, not by a count of records (a record costs 0.5-50 µs). Measured side by side
#: (benchmarks/RESULTS.md, issue 15): 50 µs slices kept the resolver's holds near 100 µs on the
#: CPU VM but cost 1.3-2 µs more process CPU per cycle (every slice has ~10 µs of fixed work
#: and a GIL handoff), and on the H200 they did not raise throughput (0.5 points lower than
#: 200 µs slices, averaged over six workloads, in two runs), so the target is 200 µs.
SLICE_NS = 200_000
MIN_CHUNK = 16
MAX_CHUNK = 2048
#: Pause between two slices of one drain. ``time.sleep(0)`` releases the GIL but does not hand
#: it over: the resolver's own syscall returns before the woken worker is scheduled, and it
#: takes the GIL straight back (the worker then waits out the 5 ms switch interval). A real
#: sleep lets a waiting worker in.
YIELD_SECONDS = 20e-6
#: Hot-path cost of one phase boundary without a CUDA event (measured 0.25-0.35 µs on the
#: H200's host and on the CPU VM: benchmarks/RESULTS.md); part of the self-reported overhead.
HOST_STAMP_NS = 300

_log = logging.getLogger("specobs")


class ResolvedCycle:
    """A cycle after resolution: durations in nanoseconds, counts, and trace ids if traced."""

    __slots__ = (
        "accept_lengths",
        "accepted",
        "batch_size",
        "drafted",
        "drafted_shape",
        "emitted",
        "end_wall_ns",
        "gpu_ns",
        "host_ns",
        "index",
        "phase_span_ids",
        "phases",
        "span_id",
        "start_wall_ns",
        "trace_id",
    )

    def __init__(self) -> None:
        self.index = 0
        self.phases: tuple[str, ...] = ()
        self.start_wall_ns = 0
        self.end_wall_ns = 0
        self.host_ns: list[int] = []
        self.gpu_ns: list[int] | None = None
        self.batch_size: int | None = None
        self.drafted = 0
        self.accepted = 0
        self.emitted = 0
        self.accept_lengths: list[int] | None = None
        # Per-sequence draft lengths, or (k, sequences) when every sequence drafted k.
        self.drafted_shape: list[int] | tuple[int, int] | None = None
        self.trace_id: int | None = None
        self.span_id: int | None = None
        self.phase_span_ids: list[int] | None = None

    @property
    def host_cycle_ns(self) -> int:
        return sum(self.host_ns)

    @property
    def gpu_cycle_ns(self) -> int | None:
        return None if self.gpu_ns is None else sum(self.gpu_ns)

    def __repr__(self) -> str:
        return (
            f"ResolvedCycle(index={self.index}, host_ns={self.host_ns}, gpu_ns={self.gpu_ns}, "
            f"batch_size={self.batch_size}, drafted={self.drafted}, accepted={self.accepted})"
        )


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
        backlog_size: int,
        overhead_budget: float,
        trace_head_rate: float,
        trace_slow_cycle_seconds: float | None,
        want_traces: bool,
        want_cycles: bool = False,
        name: str = "specobs-resolver",
    ) -> None:
        self.rec = recorder
        self.agg = aggregation
        self.sinks = list(sinks)
        self.anchor = anchor
        self.poll = poll_interval_seconds
        self.chunk = CHUNK
        self.backlog_size = backlog_size
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
        self._folded: dict[str, int] = {}
        #: bytes.translate deletion tables: deleting the bytes 0..k from a column of accepted
        #: lengths leaves exactly the values above k (a whole column checked at C speed).
        self._upto = [bytes(range(k + 1)) for k in range(aggregation.max_draft_length + 1)]
        #: Longest single hold of the GIL by this resolver's work (thread CPU nanoseconds of
        #: one slice, between two points where it releases the GIL), for benchmarks.
        self.max_hold_ns = 0
        self.long_holds = 0  # slices over 100 µs (a garbage collection inside one, say)
        self._record_ns = 0.0  # EWMA of the resolver's thread CPU per record
        self._cpu_acc = 0  # thread CPU and records since the last _adapt
        self._n_acc = 0
        self.slices = 0  # GIL holds taken (slices of work), for benchmarks
        self.slice_ns = SLICE_NS
        self.yield_seconds = YIELD_SECONDS

    def _init_sync_state(self) -> None:
        self.backlog: deque[Cycle] = deque()
        self.consumed = 0  # records taken off the backlog (resolved or dropped)
        self.drains = 0  # completed drain passes (force_flush waits for one that began later)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._drain_lock = threading.Lock()
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
        lost = len(self.backlog) + len(self.rec.queue)
        self._init_sync_state()
        self._rng = random.Random()  # else parent and child draw the same trace ids
        rec = self.rec
        rec.queue.clear()
        self.consumed = rec.enqueued - rec.dropped_queue_full
        rec.dropped_records.clear()
        self.agg.lock = threading.Lock()
        self.agg.reset()
        # What the recorder counted before the fork belongs to the parent: fold from here on.
        self._folded = {
            "event_pool_exhausted": rec.dropped_pool,
            "graph_capture": rec.dropped_capture,
            "misuse": rec.discarded,
            "queue_full": rec.dropped_queue_full,
            **{"err:" + kind: n for kind, n in list(rec.errors.items())},
        }
        self._cost_ewma = 0.0
        self._cycle_ewma = 0.0
        with self.agg.lock:
            self.agg.dropped["fork"] += lost
        rec.current = None
        if start:
            self.start()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.poll)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.drain()
            except Exception as exc:  # keep the thread alive whatever a sink does
                _log.exception("specobs: resolver error, continuing: %r", exc)

    def force_flush(self, timeout_seconds: float) -> bool:
        """Wait until every record enqueued before this call is resolved and handed to sinks.

        Returns False if that did not happen within ``timeout_seconds`` (e.g. GPU work that has
        not finished yet). Never waits longer.
        """
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
                self._wake.set()
            if (
                self.consumed + self.rec.dropped_queue_full >= target
                and not self.rec.queue
                and self.drains >= passes
            ):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._cond:
                self._cond.wait(min(remaining, 0.002))
        ok = True
        for sink in self.sinks:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                ok = sink.force_flush(remaining) and ok
            except Exception as exc:
                _log.warning("specobs: sink %r force_flush failed: %r", sink, exc)
                ok = False
        return ok

    def shutdown(self, timeout_seconds: float) -> None:
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        self.force_flush(max(0.0, (deadline - time.monotonic()) / 2))
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(max(0.0, min(1.0, deadline - time.monotonic())))
        # Whatever is still pending (GPU never completed in time) is dropped and counted.
        with self._drain_lock:
            lost = len(self.backlog) + len(self.rec.queue)
            self.backlog.clear()
            self.rec.queue.clear()
            with self.agg.lock:
                self.agg.dropped["shutdown"] += lost
        for sink in self.sinks:
            try:
                sink.shutdown(max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                _log.warning("specobs: sink %r shutdown failed: %r", sink, exc)

    # -- the work --------------------------------------------------------------------------------
    def drain(self) -> int:
        """Resolve every record whose events completed. Returns how many were resolved.

        In slices of about ``SLICE_NS`` of thread CPU each (one GIL hold), with a short sleep
        between slices so a worker waiting for the GIL gets it.
        """
        total = 0
        while True:
            limit = self.chunk
            with self._drain_lock:
                t_cpu = time.thread_time_ns()
                taken_box = [0]
                cpu = 0
                try:
                    n = self._drain_locked(taken_box, limit)
                finally:
                    # Counted only now, after aggregation, sinks and accounting: force_flush()
                    # waits on this number, so it must not move before the data it stands for
                    # is visible -- and it must move even if something raised, or every later
                    # flush would wait its whole timeout for records that are gone.
                    cpu = time.thread_time_ns() - t_cpu
                    if cpu > self.max_hold_ns:
                        self.max_hold_ns = cpu
                    if cpu > 100_000:
                        self.long_holds += 1
                    with self.agg.lock:
                        self.agg.cpu_seconds["resolver"] += cpu / 1e9
                    self.consumed += taken_box[0]
            self.slices += 1
            if n:
                self._cpu_acc += cpu
                self._n_acc += n
            # Size the next slice by time: a record costs 0.5-50 µs depending on batch size,
            # GPU sampling, sinks and the machine, so no fixed count bounds the hold. Grow
            # after a full slice well under the target, shrink after any slice over it. Not
            # from cpu / n: a slice's fixed cost (~10 µs here, more under contention) would
            # read as per-record cost and shrink slices until fixed cost is all they do.
            if n >= limit and cpu * 2 < self.slice_ns:
                self.chunk = min(MAX_CHUNK, limit * 2)
            elif cpu > self.slice_ns and n > MIN_CHUNK:
                self.chunk = max(MIN_CHUNK, n * self.slice_ns // cpu)
            if n < limit or (not self.backlog and not self.rec.queue):
                self.drains += 1
                with self._cond:
                    self._cond.notify_all()
                return total + n
            with self._cond:
                self._cond.notify_all()
            total += n
            # A full slice and more to do: let a worker waiting for the GIL have it first.
            time.sleep(self.yield_seconds)

    def _drain_locked(self, taken_box: list[int], chunk: int) -> int:
        """Take what is ready off the backlog, resolve it, hand it to the sinks.

        ``taken_box[0]`` is set to the records taken off the backlog (resolved or dropped) as
        soon as they are taken, so the caller can account for them whatever happens next.
        """
        rec = self.rec
        clock = rec.clock
        q = rec.queue
        backlog = self.backlog
        # C-level pops, ~15 ns a record (the worker appends concurrently; only this thread
        # pops, so the length read first can be popped), bounded per hold.
        backlog.extend(starmap(q.popleft, repeat((), min(len(q), 4096))))
        dropped_full = 0
        while len(backlog) > self.backlog_size:
            old = backlog.popleft()
            self._release(old)
            dropped_full += 1
        while rec.dropped_records:
            self._release(rec.dropped_records.popleft())

        ready: list[Cycle]
        if clock is None:  # nothing to wait for
            ready = list(starmap(backlog.popleft, repeat((), min(chunk, len(backlog)))))
        else:
            # Only GPU-sampled records and CUDA acceptance copies are queried; for the rest
            # the walk is two attribute reads.
            ready = []
            query = clock.query
            for c in backlog:
                if len(ready) >= chunk:
                    break
                ev = c._ev
                if ev is not None and not query(ev[-1]):
                    break
                copy = c._acc_copy
                if copy is not None and not query(copy.event):
                    break
                ready.append(c)
            for _ in starmap(backlog.popleft, repeat((), len(ready))):
                pass
        taken_box[0] = dropped_full + len(ready)

        try:
            out = self._resolve_all(ready, clock, dropped_full)
        except Exception as exc:
            # A bug, not bad input (bad values are validated per cycle before anything is
            # applied): the chunk is lost as a whole and counted, never half-applied.
            _log.exception("specobs: resolver error; %d records dropped: %r", len(ready), exc)
            for c in ready:
                self._release(c)
            with self.agg.lock:
                self.agg.dropped["resolver_error"] = (
                    self.agg.dropped.get("resolver_error", 0) + len(ready)
                )
                self.agg.dropped["queue_full"] += dropped_full
                self.agg.errors["internal"] = self.agg.errors.get("internal", 0) + 1
                self.agg.generation += 1
            return 0
        if out:
            for sink in self.sinks:
                try:
                    sink.on_cycles(out)
                except Exception as exc:
                    rec.log.warn("sink", f"sink {type(sink).__name__} failed on cycles: {exc!r}")
        return len(ready)

    def _release(self, c: Cycle) -> None:
        clock = self.rec.clock
        if c._ev is not None and clock is not None:
            clock.release(c._ev)
            c._ev = None
        copy = c._acc_copy
        if copy is not None:
            c._acc_copy = None
            try:
                copy.release()
            except Exception:
                pass

    def _resolve_all(
        self, ready: list[Cycle], clock: Any, dropped_full: int
    ) -> list[ResolvedCycle]:
        """Resolve and aggregate a batch. Returns the cycles the sinks should see.

        This runs for every cycle on a thread that shares the GIL with the worker, so the common
        work is done column-wise over the whole batch with C-level builtins (a sorted column and
        one bisect per bucket bound instead of one bisect per value; ``sum``/``min``/``max`` over
        concatenated acceptance). Only GPU-sampled cycles, traced cycles, and cycles a sink asked
        for (the memory sink) get per-cycle Python work.

        Two stages, so a chunk is applied whole or not at all: everything that can fail on what
        a caller passed (acceptance, draft lengths, batch sizes, GPU timings) is validated and
        converted first, per cycle where a column check fails, each bad value counted in
        ``errors{kind}`` and costing only its own cycle's value; then, under the aggregation
        lock, only arithmetic on validated numbers is applied.
        """
        agg = self.agg
        rec = self.rec
        trace = self.want_traces
        need_all = self.want_cycles
        head = self.head_rate
        slow = self.slow_ns
        rng = self._rng
        anchor_wall = self.anchor.wall_ns - self.anchor.perf_ns
        phases = rec.phases
        nph = len(phases)
        out: list[ResolvedCycle] = []
        if not ready:
            with agg.lock:
                self._fold(agg)
                agg.dropped["queue_full"] += dropped_full
                if dropped_full:
                    agg.generation += 1
            return out

        # -- stage 1: compute and validate (nothing shared is written) -----------------------
        # Host clock, column-wise (nanoseconds).
        tss = [c._ts for c in ready]
        host_cols = [[(t[i + 1] - t[i]) * 1e-9 for t in tss] for i in range(nph)]
        totals = [t[-1] - t[0] for t in tss]
        cycle_host = [v * 1e-9 for v in totals]

        # GPU clock: sampled cycles only; every event of these cycles has completed.
        gpu_of: dict[int, list[int]] = {}
        cost = 0
        if clock is not None:
            el = clock.elapsed_ns
            for j, c in enumerate(ready):
                ev = c._ev
                if ev is None:
                    continue
                c._ev = None
                try:
                    gpu_of[j] = [el(ev[i], ev[i + 1]) for i in range(len(ev) - 1)]
                except Exception as exc:
                    rec.log.warn("elapsed", f"could not read GPU event times: {exc!r}")
                clock.release(ev)
                cost += c._cost
        gcols = list(gpu_of.values())
        try:
            gpu_sums = [sum(g) for g in gcols]
            ok = type(sum(gpu_sums)) is int  # a float or None anywhere shows here
        except TypeError:
            ok = False
        if not ok:  # a clock that returned something odd: keep only well-formed cycles
            rec.log.warn("elapsed", "GPU event times are not integer nanoseconds; those cycles "
                         "are counted without GPU times")
            gpu_of = {j: g for j, g in gpu_of.items()
                      if all(type(x) is int and x >= 0 for x in g)}
            gcols = list(gpu_of.values())
            gpu_sums = [sum(g) for g in gcols]
        gpu_phase_cols = [[g[i] * 1e-9 for g in gcols] for i in range(nph)] if gcols else []
        gpu_cycle = [v * 1e-9 for v in gpu_sums]

        accs, batches = self._acceptance_batch(ready)
        column = b""
        if accs is not None:
            # Validated ints in 0..max_draft_length (<= 64): as bytes, each count below is a
            # C-speed scan (10x faster than list.count on this column).
            column = accs[0] if type(accs[0]) is bytes else bytes(accs[0])
        counts_by_value = [column.count(v) for v in range(agg.max_draft_length + 1)]

        traced: list[int] = []
        if trace:
            rand = rng.random
            traced = [j for j in range(len(ready)) if rand() < head]
            if slow is not None:
                picked = set(traced)
                for j, tot in enumerate(totals):
                    gj = gpu_of.get(j)
                    if (sum(gj) if gj is not None else tot) >= slow and j not in picked:
                        traced.append(j)
                traced.sort()

        want = set(traced)
        for j in (range(len(ready)) if need_all else traced):
            c = ready[j]
            ts = tss[j]
            r = ResolvedCycle()
            r.index = c.index
            r.phases = phases
            r.start_wall_ns = anchor_wall + ts[0]
            r.end_wall_ns = anchor_wall + ts[-1]
            r.host_ns = [ts[i + 1] - ts[i] for i in range(nph)]
            r.gpu_ns = gpu_of.get(j)
            r.batch_size = c._batch
            a = self._resolved_acceptance(c) if accs is not None else None
            if a is not None:
                r.accept_lengths, r.accepted, r.drafted, r.emitted, r.drafted_shape = a
                if r.batch_size is None:
                    r.batch_size = len(r.accept_lengths)
            if j in want:
                r.trace_id = rng.getrandbits(128) or 1
                r.span_id = rng.getrandbits(64) or 1
                r.phase_span_ids = [rng.getrandbits(64) or 1 for _ in range(nph)]
            out.append(r)
        last_ts = (anchor_wall + tss[-1][-1]) / 1e9

        # -- stage 2: apply (validated numbers only; nothing here can raise on input) --------
        with agg.lock:
            self._fold(agg)
            agg.dropped["queue_full"] += dropped_full
            agg.cycles += len(ready)
            for i in range(nph):
                agg.phase_host[i].observe_many(host_cols[i])
            agg.cycle_host.observe_many(cycle_host)
            if gcols:
                agg.sampled_cycles += len(gcols)
                for i in range(nph):
                    agg.phase_gpu[i].observe_many(gpu_phase_cols[i])
                agg.cycle_gpu.observe_many(gpu_cycle)
            if accs is not None:
                _, accepted, drafted, emitted, k_counts = accs
                agg.draft_tokens += drafted
                agg.accepted_tokens += accepted
                agg.emitted_tokens += emitted
                al = agg.accept_length
                counts = al.counts
                for value, n in enumerate(counts_by_value):
                    if n:
                        counts[value] += n
                al.sum += accepted
                dbk = agg.drafted_by_k
                for kk, n in k_counts.items():
                    dbk[kk] += n
            if batches:
                agg.batch_size.observe_many(batches)
            agg.last_cycle_timestamp = last_ts
            for r in out:
                if r.trace_id is not None:
                    self._exemplars(agg, r)
            agg.generation += 1
        self._adapt(cost, len(gpu_of), sum(totals) / len(ready))
        return out

    def _acceptance_batch(
        self, ready: list[Cycle]
    ) -> tuple[tuple[list[int] | bytes, int, int, int, dict[int, int]] | None, list[int]]:
        """Acceptance of a whole batch (see ``_acceptance_each``), by columns when it can.

        The common case -- every cycle gave a list, one integer draft length for all, the
        default emitted count -- is read with C-level ``map``/``set``/``bytes`` over the whole
        slice, with no Python work per cycle or per sequence: ``bytes()`` rejects a non-int or
        a value outside 0..255 anywhere, and deleting the bytes 0..k (``translate``) leaves
        exactly the values above the draft length. Anything else, or any bad value, goes to
        the per-cycle path, which counts it against its own cycle only.
        """
        try:
            fast = self._acceptance_columns(ready)
        except (TypeError, ValueError, OverflowError, AttributeError):
            fast = None
        return fast if fast is not None else self._acceptance_each(ready)

    def _acceptance_columns(
        self, ready: list[Cycle]
    ) -> tuple[tuple[bytes, int, int, int, dict[int, int]], list[int]] | None:
        accs = list(map(_GET_ACC, ready))
        if set(map(type, accs)) != _LIST_ONLY:
            return None
        if set(map(_GET_EMITTED, ready)) != _NONE_ONLY:  # a list there raises TypeError
            return None
        dls = set(map(_GET_DRAFT_LEN, ready))
        if len(dls) != 1:
            return None
        k_max = self.agg.max_draft_length
        (k,) = dls
        if k is None:
            k = k_max
        elif type(k) is not int or not 0 <= k <= k_max:
            return None
        # One bytes() per cycle, joined: 35 % cheaper than bytes() over a chained iterator at
        # batch 64 (it can presize from each list); either raises on a bad element.
        column = b"".join(map(bytes, accs))
        if column.translate(None, self._upto[k]):  # a value above the draft length
            return None
        lens = list(map(len, accs))
        sequences = len(column)
        given = list(map(_GET_BATCH, ready))
        if given.count(None) == len(given):
            batches = lens
        else:
            batches = [n if b is None else b for n, b in zip(lens, given, strict=True)]
            if not _batches_ok(batches):
                return None
        accepted = 0
        for v in range(1, k + 1):
            accepted += v * column.count(v)
        return (column, accepted, k * sequences, accepted + sequences, {k: sequences}), batches

    def _acceptance_each(
        self, ready: list[Cycle]
    ) -> tuple[tuple[list[int] | bytes, int, int, int, dict[int, int]] | None, list[int]]:
        """Acceptance of a whole batch: (concatenated lengths, accepted, drafted, emitted,
        sequences by draft length) and the batch sizes, all validated.

        The common case — a list of ints with one integer draft length and the default emitted
        count — is validated once for the whole batch with C-level builtins over the
        concatenation (``bytes()`` rejects any non-int or value outside 0..255 anywhere in it,
        ``min``/``max`` bound it by the draft length); only if that fails, or for other inputs,
        is each cycle validated on its own, so a bad value costs only its own cycle's
        acceptance. Batch sizes get the same treatment: a column check, then per cycle.
        """
        k_max = self.agg.max_draft_length
        fast_lengths: list[int] = []
        fast: list[Cycle] = []
        k_counts: dict[int, int] = {}
        k_min = k_max
        slow: list[Cycle] = []
        batches: list[int] = []
        for c in ready:
            acc = c._acc
            c._resolved_acc = None
            if acc is None and c._acc_copy is None:
                if c._batch is not None:
                    batches.append(c._batch)
                continue
            dl = c._draft_len  # set by accept(), with _acc / _acc_copy
            if dl is not None and type(dl) is not int:
                dl = c._draft_len = _as_scalar_count(dl)  # numpy / torch scalars; else as was
            if type(acc) is list and (dl is None or type(dl) is int) and c._emitted is None:
                k = k_max if dl is None else dl
                n = len(acc)
                fast_lengths += acc
                fast.append(c)
                k_counts[k] = k_counts.get(k, 0) + n
                if k < k_min:
                    k_min = k
                batches.append(n if c._batch is None else c._batch)
            else:
                slow.append(c)
        all_lengths: list[int] | bytes = []
        accepted = drafted = emitted = 0
        if fast:
            ok = k_min >= 0 and max(k_counts) <= k_max
            column = b""
            if ok and fast_lengths:
                try:
                    column = bytes(fast_lengths)  # TypeError / ValueError on any bad element
                    # Deleting the bytes 0..k_min leaves the values above it.
                    ok = not column.translate(None, self._upto[k_min])
                except (TypeError, ValueError):
                    ok = False
            if ok:
                all_lengths = column
                accepted = sum(column)
                drafted = sum(k * n for k, n in k_counts.items())
                emitted = accepted + len(column)
            else:  # someone sent bad values: find and count them one by one
                k_counts = {}
                slow = fast + slow
        if slow:
            merged = list(all_lengths)
            for c in slow:
                a = self._acceptance_of(c)
                c._resolved_acc = a
                if a is None:
                    c._acc = None  # invalid and counted: not shown on the resolved cycle either
                    continue
                lengths, acc_n, dr, em, shape = a
                merged += lengths
                accepted += acc_n
                drafted += dr
                emitted += em
                if isinstance(shape, tuple):
                    k_counts[shape[0]] = k_counts.get(shape[0], 0) + shape[1]
                else:
                    for kk in shape:
                        k_counts[kk] = k_counts.get(kk, 0) + 1
            all_lengths = merged
        if slow or not _batches_ok(batches):
            batches = self._batches(ready)
        if not all_lengths and not k_counts:
            return None, batches
        return (all_lengths, accepted, drafted, emitted, k_counts), batches

    def _batches(self, ready: list[Cycle]) -> list[int]:
        """Batch size of each cycle that has one (given, or the number of sequences whose
        acceptance is valid), validated one by one; a bad given size is counted and dropped
        (the cycle stays). Used only when the column check of the fast path failed."""
        batches: list[int] = []
        for c in ready:
            b = c._batch
            if b is not None:
                v = _as_batch(b)
                if v is None:
                    self.rec.misuse(
                        "bad_batch_size",
                        f"batch_size must be an integer between 0 and {_MAX_BATCH}, got {b!r}; "
                        f"the cycle is kept without a batch size",
                    )
                c._batch = v
                if v is not None:
                    batches.append(v)
                continue
            a = getattr(c, "_resolved_acc", None)  # set only by the per-cycle path
            if a is not None:
                batches.append(len(a[0]))
            elif type(c._acc) is list:
                batches.append(len(c._acc))
        return batches

    def _resolved_acceptance(
        self, c: Cycle
    ) -> tuple[list[int], int, int, int, list[int] | tuple[int, int]] | None:
        """The per-cycle view of acceptance for a ResolvedCycle (after _acceptance_batch)."""
        a: tuple[list[int], int, int, int, list[int] | tuple[int, int]] | None = getattr(
            c, "_resolved_acc", None
        )  # set only by the per-cycle path
        if a is not None:
            return a
        acc = c._acc
        if type(acc) is list:
            dl = c._draft_len
            k = self.agg.max_draft_length if dl is None else dl
            n = sum(acc)
            return acc, n, k * len(acc), n + len(acc), (k, len(acc))
        return None

    def _acceptance_of(
        self, c: Cycle
    ) -> tuple[list[int], int, int, int, list[int] | tuple[int, int]] | None:
        """Validated acceptance of one cycle, or None (nothing given, or bad and counted).

        Whatever the caller passed, this never raises: a value that cannot be read as counts
        costs this cycle's acceptance and one ``errors{kind="bad_acceptance"}``.
        """
        try:
            return self._acceptance_of_unchecked(c)
        except Exception as exc:
            self.rec.misuse("bad_acceptance", f"could not read the acceptance: {exc!r}")
            return None

    def _acceptance_of_unchecked(
        self, c: Cycle
    ) -> tuple[list[int], int, int, int, list[int] | tuple[int, int]] | None:
        acc = c._acc
        copy = c._acc_copy
        if copy is not None:
            c._acc_copy = None
            try:
                acc = copy.read()
            except Exception as exc:
                self.rec.misuse("bad_acceptance", f"could not read the copied acceptance: {exc!r}")
                return None
        if acc is None:
            return None
        k_max = self.agg.max_draft_length
        if type(acc) is not list and not _is_sequence(acc):
            self.rec.misuse(
                "bad_acceptance",
                f"accepted lengths must be a sequence of integers (list, tuple, array, tensor), "
                f"got {type(acc).__name__}",
            )
            return None
        try:
            lengths = [_as_count(a) for a in acc]
        except (TypeError, ValueError, OverflowError):
            self.rec.misuse("bad_acceptance", f"accepted lengths must be integers >= 0, got "
                            f"{_short(acc)}")
            return None
        lo = min(lengths, default=0)
        hi = max(lengths, default=0)
        dl = c._draft_len
        if dl is None:
            dl = k_max
        per_seq_k: list[int] | None = None
        if type(dl) is int:
            k = dl
            drafted = dl * len(lengths)
            ok = 0 <= dl <= k_max
        else:
            try:
                per_seq_k = [_as_count(x) for x in dl] if _is_sequence(dl) else []
            except (TypeError, ValueError, OverflowError):
                per_seq_k = []
            k = max(per_seq_k, default=0)
            drafted = sum(per_seq_k)
            ok = len(per_seq_k) == len(lengths) and min(per_seq_k, default=0) >= 0 and k <= k_max
        if not ok:
            self.rec.misuse(
                "bad_acceptance",
                f"draft_length must be an int (or one per sequence) between 0 and "
                f"max_draft_length={k_max}, got {_short(dl)} for {len(lengths)} sequences",
            )
            return None
        if lo < 0 or hi > k:
            self.rec.misuse(
                "bad_acceptance",
                f"accepted lengths must be between 0 and the draft length {k}, got "
                f"min={lo} max={hi}",
            )
            return None
        if per_seq_k is not None and any(a > b for a, b in zip(lengths, per_seq_k, strict=False)):
            self.rec.misuse("bad_acceptance", "an accepted length exceeds its draft length")
            return None
        accepted = sum(lengths)
        em = c._emitted
        emitted = accepted + len(lengths)
        if em is not None:
            try:
                got = sum(_as_count(x) for x in em) if _is_sequence(em) else _as_count(em)
            except (TypeError, ValueError, OverflowError):
                got = -1
            if got < 0:
                self.rec.misuse("bad_acceptance", f"emitted must be a count >= 0, got "
                                f"{_short(em)}; the default (accepted + 1 per sequence) is used")
            else:
                emitted = got
        shape: list[int] | tuple[int, int] = (
            per_seq_k if per_seq_k is not None else (k, len(lengths))
        )
        return lengths, accepted, drafted, emitted, shape

    def _exemplars(self, agg: Aggregation, r: ResolvedCycle) -> None:
        # GPU-timed cycles put exemplars on the GPU-clock histograms, host-only ones on the host's.
        if r.gpu_ns is not None:
            durations, phases, cycle = r.gpu_ns, agg.phase_gpu, agg.cycle_gpu
        else:
            durations, phases, cycle = r.host_ns, agg.phase_host, agg.cycle_host
        trace_id = f"{r.trace_id:032x}"
        when = r.end_wall_ns / 1e9
        span_ids = r.phase_span_ids or []
        for i, ns in enumerate(durations):
            h = phases[i]
            v = ns * 1e-9  # the same float the histogram counted
            h.exemplars[h.bucket(v)] = Exemplar(v, trace_id, f"{span_ids[i]:016x}", when)
        v = sum(durations) * 1e-9
        cycle.exemplars[cycle.bucket(v)] = Exemplar(v, trace_id, f"{r.span_id:016x}", when)

    def _fold(self, agg: Aggregation) -> None:
        rec = self.rec
        cur = {
            "event_pool_exhausted": rec.dropped_pool,
            "graph_capture": rec.dropped_capture,
            "misuse": rec.discarded,
            "queue_full": rec.dropped_queue_full,
        }
        for key, value in cur.items():
            prev = self._folded.get(key, 0)
            if value != prev:
                agg.dropped[key] += value - prev
                self._folded[key] = value
        for kind, value in list(rec.errors.items()):
            key = "err:" + kind
            prev = self._folded.get(key, 0)
            if value != prev:
                agg.errors[kind] = agg.errors.get(kind, 0) + value - prev
                self._folded[key] = value

    def _adapt(self, cost: int, n_sampled: int, mean_cycle: float) -> None:
        if self._n_acc:
            per = self._cpu_acc / self._n_acc
            self._record_ns = sampling.smoothed(self._record_ns, per)
            self._cpu_acc = self._n_acc = 0
        self._cycle_ewma = sampling.smoothed(self._cycle_ewma, mean_cycle)
        if n_sampled:
            self._cost_ewma = sampling.smoothed(self._cost_ewma, cost / n_sampled)
        rec = self.rec
        if rec.sample_every is None and self._cost_ewma > 0:
            rec.interval = sampling.adaptive_interval(
                self._cost_ewma, self._cycle_ewma, self.budget
            )
        with self.agg.lock:
            if n_sampled:
                self.agg.cpu_seconds["hot_path"] += cost / 1e9
            self.agg.sampling_interval = rec.interval
            if self._cycle_ewma > 0:
                # What the worker loses per cycle: event records on sampled cycles (measured on
                # the hot path), host stamps (an estimate per boundary), and the resolver's own
                # CPU per record, which shares the GIL with the worker.
                per_cycle = (
                    self._cost_ewma / max(rec.interval, 1)
                    + HOST_STAMP_NS * (rec.nphases + 1)
                    + self._record_ns
                )
                self.agg.overhead_ratio = per_cycle / self._cycle_ewma


_GET_ACC = attrgetter("_acc")
_GET_EMITTED = attrgetter("_emitted")
_GET_DRAFT_LEN = attrgetter("_draft_len")
_GET_BATCH = attrgetter("_batch")
_LIST_ONLY = {list}
_NONE_ONLY = {None}

#: Largest batch size counted; anything above is a caller's bug, not a batch.
_MAX_BATCH = 1 << 31
#: Most sequences one cycle's acceptance may hold (bounds the resolver's work per cycle).
_MAX_SEQUENCES = 1 << 20


def _is_sequence(x: Any) -> bool:
    """A finite, ordered collection of per-sequence values: list, tuple, range, array, tensor.

    Not a string, a mapping (``{1: 2}`` would count its keys), a set (unordered, deduplicated)
    or an iterator (it could be endless, and the resolver must finish its chunk).
    """
    if isinstance(x, (str, bytes, bytearray, Mapping, Set)):
        return False
    try:
        n = len(x)
    except Exception:
        return False
    return isinstance(n, int) and n <= _MAX_SEQUENCES and hasattr(x, "__getitem__")


def _as_count(a: Any) -> int:
    """An integer count from an int, an integral float, or a numpy/torch integer scalar.

    Raises ValueError for bools, NaN, infinities, fractions and anything else.
    """
    if type(a) is int:
        return a
    if isinstance(a, bool):
        raise ValueError(f"not an integer count: {a!r}")
    try:
        return operator.index(a)  # numpy integers, 0-d integer tensors
    except TypeError:
        pass
    if isinstance(a, float) and a.is_integer():  # also rejects NaN and infinities
        return int(a)
    raise ValueError(f"not an integer count: {a!r}")


def _batches_ok(batches: list[Any]) -> bool:
    """Whether every batch size is an int in 0.._MAX_BATCH, with C-level builtins only: a float
    anywhere makes the sum a float, a string or None makes it raise."""
    try:
        return type(sum(batches)) is int and (
            not batches or (min(batches) >= 0 and max(batches) <= _MAX_BATCH)
        )
    except (TypeError, ValueError):
        return False


def _as_scalar_count(dl: Any) -> Any:
    """A numpy or torch integer scalar ``draft_length`` as an int; anything else unchanged
    (a per-sequence sequence, or a bad value that per-cycle validation counts)."""
    if isinstance(dl, bool) or _is_sequence(dl):
        return dl
    try:
        return _as_count(dl)
    except Exception:
        return dl


def _as_batch(b: Any) -> int | None:
    try:
        v = _as_count(b)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if 0 <= v <= _MAX_BATCH else None


def _short(x: Any) -> str:
    """A bounded repr for log messages (a caller's value may be huge)."""
    try:
        text = repr(x)
    except Exception:
        text = f"<{type(x).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."
