"""The hot path: what runs on the inference worker's thread at every phase boundary.

Rules this module keeps (and why):

* stdlib only, no imports of torch/numpy: the worker pays for every attribute lookup;
* never raises into the worker: every entry point catches, counts and logs (rate-limited);
* never synchronizes the GPU: CUDA events are *recorded* here and *queried* by the resolver;
* bounded memory: records go to a deque whose oldest entry is dropped (and counted) when full.

A cycle is ``begin`` → ``mark(phase)`` for each later phase → ``end``, with ``accept(...)``
anywhere before ``end``. ``begin`` starts the first phase; each ``mark`` ends the running phase and
starts the named one, which must be the next in order; ``end`` ends the last phase.
"""

from __future__ import annotations

import logging
import reprlib
import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING, Any

from specobs.timing._base import record_stream_of

if TYPE_CHECKING:
    from specobs.timing import EventClock

__all__ = ["Cycle", "Message", "Recorder", "short_repr"]

_log = logging.getLogger("specobs")
_perf = time.perf_counter_ns
_LOG_EVERY_NS = 60 * 1_000_000_000


def _nothing() -> None:
    pass


_getrefcount = getattr(sys, "getrefcount", None)


def _refcounts(records: list[Any]) -> list[int]:
    """``sys.getrefcount`` of each record as seen from this function (see :data:`SOLE_REFS`)."""
    return list(map(_getrefcount, records))  # type: ignore[arg-type]


def _sole_refs() -> int:
    """What :func:`_refcounts` reads for an object that only the list passed to it holds, or 0
    where references cannot be counted that way (so records are never recycled there).

    Calibrated through the same function the resolver uses, so the interpreter's own temporary
    references (the iterator's, the argument's) cancel out whatever the CPython version. On a
    free-threaded build reference counts are split between threads and do not add up the same
    way; on PyPy there is no reference count."""
    if sys.implementation.name != "cpython" or _getrefcount is None:
        return 0
    gil = getattr(sys, "_is_gil_enabled", None)
    if gil is not None and not gil():
        return 0
    n = _refcounts([object()])[0]
    held = object()
    if _refcounts([held])[0] != n + 1:  # one more holder must read as one more reference
        return 0
    return n


#: The reference count :func:`_refcounts` reads for a record nobody but the resolver's list
#: holds; 0 disables recycling.
SOLE_REFS = _sole_refs()


#: A log message, or what builds it: a callable is called only when the line is emitted.
Message = str | Callable[[], str]


class _BoundedRepr(reprlib.Repr):
    """``reprlib`` limits applied to subclasses of the builtin containers too, and never more
    work than the text shown: no sort of a whole set or dict, no ``repr`` of a whole huge int."""

    _BUILTINS = (
        (str, "str"), (bytes, "bytes"), (bytearray, "bytes"), (int, "int"), (list, "list"),
        (tuple, "tuple"), (dict, "dict"), (set, "set"), (frozenset, "frozenset"),
        (deque, "deque"),
    )

    def repr1(self, x: Any, level: int) -> str:
        for base, name in self._BUILTINS:
            if isinstance(x, base):
                return getattr(self, "repr_" + name)(x, level)  # type: ignore[no-any-return]
        return self.repr_instance(x, level)

    def repr_instance(self, x: Any, level: int) -> str:
        try:
            text = repr(x)
        except Exception:
            return f"<{type(x).__name__}>"
        n = self.maxother
        return text if len(text) <= n else text[: n - 3] + "..."

    def repr_str(self, x: Any, level: int) -> str:
        n = self.maxstring
        head = str.__getitem__(x, slice(0, n))
        return repr(head) + ("..." if len(x) > n else "")

    def repr_bytes(self, x: Any, level: int) -> str:
        n = self.maxstring
        head = bytes(memoryview(x)[:n])
        return repr(head) + ("..." if len(x) > n else "")

    def repr_int(self, x: Any, level: int) -> str:
        if x.bit_length() > 128:  # repr is quadratic in the digits (and refused past 4300)
            return f"<int of {x.bit_length()} bits>"
        return int.__repr__(x) if type(x) is int else self.repr_instance(x, level)  # bool, enum

    def repr_dict(self, x: Any, level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        pieces = [
            f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
            for k, v in islice(dict.items(x), self.maxdict)
        ]
        return "{" + ", ".join(pieces) + (", ..." if len(x) > self.maxdict else "") + "}"

    def repr_set(self, x: Any, level: int) -> str:
        return self._items(x, level, "{", "}", self.maxset) if x else "set()"

    def repr_frozenset(self, x: Any, level: int) -> str:
        return self._items(x, level, "frozenset({", "})", self.maxfrozenset) if x else "frozenset()"

    def repr_list(self, x: Any, level: int) -> str:
        return self._items(x, level, "[", "]", self.maxlist)

    def repr_tuple(self, x: Any, level: int) -> str:
        return self._items(x, level, "(", ",)" if len(x) == 1 else ")", self.maxtuple)

    def repr_deque(self, x: Any, level: int) -> str:
        return self._items(x, level, "deque([", "])", self.maxdeque)

    def _items(self, x: Any, level: int, left: str, right: str, most: int) -> str:
        """The first ``most`` items (in iteration order: a set is not sorted first)."""
        if level <= 0 and len(x):
            return left + "..." + right
        pieces = [self.repr1(v, level - 1) for v in islice(x, most)]
        if len(x) > most:
            pieces.append("...")
        return left + ", ".join(pieces) + right


_REPR = _BoundedRepr()
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlevel = 3


def short_repr(x: Any, limit: int = 80) -> str:
    """A repr of a caller's value for a log message: at most ``limit`` characters, and no more
    work than that text takes for strings, bytes, ints and the builtin containers (a few items
    shown, the rest elided), whatever their size. Other objects' own ``repr`` is called once and
    cut. Never raises (a ``repr`` that raises gives ``<TypeName>``).

    Only call it where a message is about to be emitted: an object's ``repr`` may be slow."""
    try:
        text = _REPR.repr(x)
    except Exception:
        try:
            text = f"<{type(x).__name__}>"
        except Exception:
            text = "<?>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RateLimitedLog:
    """Log each kind of problem once, then at most once a minute, with a suppressed count.

    ``message`` may be a callable that builds the text: it is called only when the line is
    emitted, so a suppressed line costs a clock read and a counter, whatever the bad value was.
    """

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        # defaultdict: ``+= 1`` calls no Python code between the read and the write, so an
        # increment from another thread is not lost under the GIL (``.get() + 1`` can be).
        self._suppressed: defaultdict[str, int] = defaultdict(int)

    def warn(self, kind: str, message: Message) -> None:
        now = _perf()
        last = self._last.get(kind)
        if last is not None and now - last < _LOG_EVERY_NS:
            self._suppressed[kind] += 1
            return
        self._last[kind] = now
        n = self._suppressed.pop(kind, 0)
        extra = f" ({n} similar messages suppressed)" if n else ""
        if not isinstance(message, str):
            try:
                message = message()
            except Exception as exc:  # a message must never cost the worker more than itself
                message = f"{kind} (the message could not be built: {type(exc).__name__})"
        _log.warning("specobs: %s%s", message, extra)


class Cycle:
    """One speculative decoding cycle in flight. Created by :meth:`Observer.begin`.

    Also a context manager: ``with observer.cycle() as c: ...`` ends the cycle on exit.

    The object is also the record the resolver reads, and it is **pooled**: once resolved, a
    record that nobody else holds goes back to its recorder's free list and ``begin`` hands it
    out again, so a steady loop allocates no garbage-collected object per cycle (records wait
    up to a poll interval in the queue, long enough to survive young collections and drive
    full ones). The record fields are a contract between this module (which writes them on
    the worker thread, and resets them in :meth:`Recorder.recycle` on the resolver thread)
    and ``_resolver.py`` / ``_acceptance.py`` (which read them once the cycle was enqueued):

    ``_ts``
        host timestamps (``perf_counter_ns``), one per boundary; its length is the index of the
        phase to start next. Reused: emptied by ``recycle``.
    ``_ev`` / ``_cost``
        the CUDA events of a sampled cycle (``None`` otherwise) and the hot-path nanoseconds
        their records cost; the resolver reads, releases and clears ``_ev``.
    ``_acc`` / ``_acc_copy``
        acceptance as given (a list held in ``_accbuf``, refilled each cycle, or whatever the
        caller passed) / a pending CUDA copy; both ``None`` when ``accept`` was not called.
        The resolver reads a completed copy into ``_acc`` (and clears ``_acc_copy``) before
        validating. Anything kept from ``_acc`` past resolution must be copied: the list is
        reused.
    ``_draft_len`` / ``_emitted``
        set by ``accept`` (read only when ``_acc`` or ``_acc_copy`` is set).
    ``_batch``
        the batch size given to ``begin`` / ``accept``, untouched.
    ``_resolved_acc``
        written by the resolver's validation (the per-cycle path), reset by ``recycle``.

    A handle kept past ``end()`` stays valid and closed (its calls are counted as misuse) and is
    never recycled: ``recycle`` reuses only records whose reference count shows that the
    resolver holds the sole reference (CPython with a GIL; elsewhere nothing is recycled).
    """

    __slots__ = (
        "_acc",
        "_acc_copy",
        "_accbuf",
        "_batch",
        "_closed",
        "_cost",
        "_draft_len",
        "_emitted",
        "_ev",
        "_rec",
        "_resolved_acc",
        "_ts",
        "index",
    )

    #: Set by the resolver (never on the hot path): the validated acceptance.
    _resolved_acc: Any
    #: Set by accept() (read only when ``_acc`` or ``_acc_copy`` is set).
    _draft_len: Any
    _emitted: Any
    #: Hot-path nanoseconds spent on events; set with ``_ev``.
    _cost: int

    def __init__(self, rec: Recorder, index: int, t0: int, batch_size: int | None) -> None:
        self._rec = rec
        self.index = index
        self._ts = [t0]
        self._ev: list[Any] | None = None
        self._batch = batch_size
        self._acc: Any = None
        self._acc_copy: Any = None
        self._accbuf: list[Any] | None = None
        self._resolved_acc = None
        self._closed = False

    # The three calls below are the hot path. Keep them short; failures go to _rec.
    def mark(self, phase: str) -> None:
        """End the running phase and start ``phase`` (the next one in the configured order)."""
        t = _perf()
        try:
            ts = self._ts
            rec = self._rec
            i = len(ts)
            # ``expect`` is the phase order padded with two names no caller can pass, so a
            # cycle past its last phase (or ended) fails the comparison, not the indexing.
            if rec.expect[i] != phase or self._closed:
                rec.misuse_mark(self, phase)
                return
            ts.append(t)
            ev = self._ev
            if ev is not None:
                rec.record_fn(ev[i], rec.stream)
                self._cost += _perf() - t
        except Exception as exc:  # never into the worker
            self._rec.internal_error(exc)

    def accept(
        self,
        accepted: Any,
        *,
        draft_length: Any = None,
        batch_size: int | None = None,
        emitted: Any = None,
    ) -> None:
        """Record acceptance for this cycle.

        ``accepted``: accepted draft tokens per sequence (0..k) as a list, tuple, numpy array,
        CPU tensor or CUDA tensor, of integers: bools are not counts (a bool mask is refused,
        wherever it is resolved, and counted as ``errors{kind="bad_acceptance"}``). A CUDA
        tensor is copied asynchronously into pinned memory and read by the resolver once the
        copy completed — no synchronisation here.
        ``draft_length``: tokens drafted per sequence, an int (default: ``max_draft_length``) or
        one per sequence. ``emitted``: tokens emitted per cycle, if not ``accepted + 1`` per
        sequence (the bonus token). ``batch_size`` defaults to ``len(accepted)``.
        """
        try:
            if self._closed:
                self._rec.misuse("bad_acceptance", "accept() after the cycle ended")
                return
            if batch_size is not None:
                self._batch = batch_size
            self._draft_len = draft_length
            self._emitted = emitted
            if type(accepted) is list or type(accepted) is tuple:
                # Copied (the engine may reuse its list) into this record's own list: a slice
                # assignment allocates no object the garbage collector tracks.
                buf = self._accbuf
                if buf is None:
                    self._accbuf = self._acc = list(accepted)
                    return
                buf[:] = accepted
                self._acc = buf
                return
            if getattr(accepted, "is_cuda", False):
                self._acc = None
                rec = self._rec
                t = _perf()
                self._acc_copy = rec.copy_to_host(accepted)
                # What starting the copy costs the worker: a diagnostic the GPU benchmark
                # breaks the overhead down by (not in the gauge: see Resolver._adapt).
                rec.copy_ns += _perf() - t
                if self._acc_copy is None and self._batch is None:
                    self._batch = int(accepted.numel())
                return
            tolist = getattr(accepted, "tolist", None)
            if tolist is not None:  # numpy array or CPU tensor: copy now, the caller may reuse it
                values = tolist()
                if type(values) is not list:  # a 0-d array gives a scalar: the resolver counts it
                    self._acc = values
                    return
                buf = self._accbuf
                if buf is None:
                    self._accbuf = self._acc = values
                    return
                buf[:] = values  # the temporary list dies here: nothing tracked outlives it
                self._acc = buf
                return
            self._acc = accepted  # validated by the resolver; bad values are counted there
        except Exception as exc:
            self._rec.internal_error(exc)

    def end(self) -> None:
        """End the last phase and hand the cycle to the resolver."""
        t = _perf()
        try:
            rec = self._rec
            if self._closed:
                rec.misuse("end_without_begin", "end() on a cycle that already ended")
                return
            self._closed = True  # checked and set with no call between: see Recorder.begin
            rec.current = None  # an open cycle is always the current one (begin closes the old)
            if self.index < 0:  # begun during CUDA graph capture: counted there, not a cycle
                return
            ts = self._ts
            if len(ts) != rec.nphases:
                rec.discard(self)
                rec.misuse_end(len(ts))
                return
            ts.append(t)
            ev = self._ev
            if ev is not None:
                rec.record_fn(ev[-1], rec.stream)
                self._cost += _perf() - t
            # Recorder.enqueue inlined for the common case (queue not full, no wake needed).
            q = rec.queue
            if len(q) + 1 >= rec.wake_at:
                rec.enqueue(self)
                return
            rec.enqueued += 1
            q.append(self)
        except Exception as exc:
            self._rec.internal_error(exc)

    def __enter__(self) -> Cycle:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            # The engine raised mid-cycle: the phase times are meaningless, discard quietly.
            if not self._closed:
                self._closed = True
                if self._rec.current is self:
                    self._rec.current = None
                self._rec.discard(self)
            return
        if not self._closed:
            self.end()


class _NullCycle:
    """What the hot path returns before configure and after shutdown: every call a no-op."""

    __slots__ = ()
    index = -1

    def mark(self, phase: str) -> None:
        pass

    def accept(self, accepted: Any, **kwargs: Any) -> None:
        pass

    def end(self) -> None:
        pass

    def __enter__(self) -> _NullCycle:
        return self

    def __exit__(self, *args: Any) -> None:
        pass


NULL_CYCLE = _NullCycle()


class Recorder:
    """Hot-path state of one observer. Only the worker thread mutates most of it."""

    def __init__(
        self,
        phases: tuple[str, ...],
        *,
        queue_size: int,
        sample_every: int | None,
        clock: EventClock | None,
        clock_factory: Any = None,
        max_draft_length: int = 8,
    ) -> None:
        self.phases = phases
        self.nphases = len(phases)
        # What mark() compares against: the phase order padded with two names that are not
        # strings, so a cycle past its last phase (or ended) fails the check without an IndexError.
        self.expect: tuple[Any, ...] = (*phases, None, None)
        self.queue: deque[Cycle] = deque()
        self.queue_size = queue_size
        #: Resolved records nobody holds, for ``begin`` to reuse (see :class:`Cycle`): the
        #: resolver appends, the worker pops (both atomic on a deque). At most ``pool_limit``
        #: (0 where references cannot be counted: nothing is recycled).
        self.free: deque[Cycle] = deque()
        self.pool_limit = queue_size if SOLE_REFS else 0
        self.wake_at = max(16, min(1024, queue_size // 4))
        self.wake: Any = _nothing
        self.enabled = True
        self.current: Cycle | None = None
        self.max_draft_length = max_draft_length
        self.log = RateLimitedLog()
        # Counters the worker increments and the resolver folds into the aggregation.
        self.begun = 0
        self.enqueued = 0
        self.copy_ns = 0  # worker nanoseconds spent starting CUDA acceptance copies
        self.dropped_queue_full = 0
        self.dropped_pool = 0
        self.dropped_capture = 0
        self.discarded = 0
        # defaultdict: ``errors[kind] += 1`` runs no Python code between the read and the
        # write, so under the GIL an increment is never lost to the resolver thread's (which
        # counts bad values here too) or to another thread's.
        self.errors: defaultdict[str, int] = defaultdict(int)
        # Released by the resolver when the worker dropped a record holding events.
        self.dropped_records: deque[Cycle] = deque()
        self.sample_every = sample_every
        self.interval = sample_every if sample_every is not None else 1
        self.clock: EventClock | None = clock
        self._clock_factory = clock_factory
        self._next_clock_try = 0
        self.record_fn: Any = clock.record_fn if clock is not None else None
        self.stream: Any = record_stream_of(clock) if clock is not None else None

    # -- worker thread -------------------------------------------------------------------------
    def begin(self, batch_size: int | None = None) -> Cycle | _NullCycle:
        t = _perf()
        try:
            if not self.enabled:
                return NULL_CYCLE
            cur = self.current
            if cur is not None and not cur._closed:
                # Closed before any call. Under the GIL no other thread runs between the check
                # and the write (no call, no loop between them), and end() checks and sets
                # ``_closed`` the same way: whoever closes a cycle first is the only one, so a
                # cycle discarded here is never enqueued, even if another thread (misuse: an
                # observer is one thread's) is ending it right now.
                cur._closed = True
                self.discard(cur)
                self.misuse("begin_while_open", "begin() while the previous cycle was open; "
                            "the open cycle was discarded (an observer belongs to one engine "
                            "thread: configure one per thread)")
            idx = self.begun
            self.begun = idx + 1
            free = self.free
            if free:  # only the worker pops, so a non-empty free list stays non-empty here
                c = free.pop()  # reset by recycle(): _ts empty, no events, no acceptance
                c.index = idx
                c._ts.append(t)
                c._batch = batch_size
                c._closed = False
            else:
                c = Cycle(self, idx, t, batch_size)
            self.current = c
            clock = self.clock
            if clock is None:
                if self._clock_factory is not None and idx >= self._next_clock_try:
                    self._try_clock(idx)
                    clock = self.clock
                if clock is None:
                    return c
            if idx % self.interval == 0:  # sampling.should_sample, inlined (interval >= 1)
                if clock.capturing():
                    # Inside CUDA graph capture nothing is real: not a cycle, not a timing.
                    self.dropped_capture += 1
                    c.index = -1  # end() drops it
                    return c
                ev = clock.acquire(self.nphases + 1)
                if ev is None:
                    self.dropped_pool += 1
                    self.wake()  # events come back when the resolver drains
                    return c
                self.record_fn(ev[0], self.stream)
                c._ev = ev
                c._cost = _perf() - t
            return c
        except Exception as exc:
            self.internal_error(exc)
            return NULL_CYCLE

    def _try_clock(self, idx: int) -> None:
        # Lazy CUDA start: only once the engine has initialised CUDA itself. Retried every
        # 256 cycles so a CPU-only process pays one dict lookup per 256 cycles.
        self._next_clock_try = idx + 256
        clock = self._clock_factory()
        if clock is not None:
            self.clock = clock
            self.record_fn = clock.record_fn
            self.stream = record_stream_of(clock)
            self._clock_factory = None

    def copy_to_host(self, tensor: Any) -> Any:
        clock = self.clock
        if clock is None:
            self.misuse("bad_acceptance", "a CUDA tensor was given but no CUDA clock is active; "
                        "acceptance for this cycle is not counted")
            return None
        copy = clock.copy_to_host(tensor)
        if getattr(clock, "buffers_low", False):
            clock.buffers_low = False  # type: ignore[attr-defined]
            self.wake()
        if copy is None:
            # Pinned buffers come back when the resolver reads them: ask it to run now (at
            # thousands of cycles a second, the 100 ms poll holds more copies than buffers).
            self.wake()
            self.misuse("bad_acceptance", "could not copy the CUDA acceptance tensor (no free "
                        "pinned buffer or event, unsupported dtype, or too many sequences)")
        return copy

    def enqueue(self, c: Cycle) -> None:
        q = self.queue
        if len(q) >= self.queue_size:
            try:
                old = q.popleft()
            except IndexError:
                old = None
            if old is not None:
                self.dropped_queue_full += 1
                if old._ev is not None or old._acc_copy is not None:
                    self.dropped_records.append(old)
                self.log.warn("queue_full", "record queue full; dropping the oldest cycle "
                              "records (the resolver is not keeping up)")
        self.enqueued += 1
        q.append(c)
        if len(q) >= self.wake_at:
            # The resolver polls slowly (cheap when idle); a filling queue calls it early.
            self.wake()

    # -- resolver thread -----------------------------------------------------------------------
    def recycle(self, records: list[Cycle]) -> int:
        """Put resolved records that nobody else holds back on the free list; returns how many.

        ``records`` must be the caller's only reference to them (a list it drops afterwards).
        A record with any other holder -- a caller keeping its handle after ``end()``, an
        instrumentor's tracker, ``Observer.current``, a traceback -- reads one reference more
        and is left alone (the garbage collector frees it once that holder lets go). A record
        with no other holder cannot gain one: a reference can only be copied from one that
        exists. So a stale handle never sees its cycle reused.
        """
        free = self.free
        room = self.pool_limit - len(free)
        if room <= 0 or not records:
            return 0
        sole = SOLE_REFS
        n = 0
        for c, refs in zip(records, _refcounts(records), strict=True):
            if refs != sole or c._ev is not None or c._acc_copy is not None:
                continue
            c._ts.clear()
            c._acc = None
            c._resolved_acc = None
            c._draft_len = None
            c._emitted = None
            free.append(c)
            n += 1
            if n >= room:
                break
        return n

    def discard(self, c: Cycle) -> None:
        self.discarded += 1
        if c._ev is not None or c._acc_copy is not None:
            self.dropped_records.append(c)

    def misuse(self, kind: str, message: Message) -> None:
        """Count one ``errors{kind}`` and log it, rate-limited. Called on the worker's thread
        (the hot path) and the resolver's (bad values): pass the message as a callable when
        building it costs anything (a caller's value: always through :func:`short_repr`), so
        a suppressed line never builds it."""
        self.errors[kind] += 1
        self.log.warn(kind, message)

    def misuse_value(self, kind: str, before: str, value: Any, after: str = "") -> None:
        """:meth:`misuse` with a message showing a caller's ``value`` between ``before`` and
        ``after``, through :func:`short_repr`, built only if the line is emitted."""
        self.misuse(kind, lambda: before + short_repr(value) + after)

    def misuse_mark(self, c: Cycle, phase: Any) -> None:
        phases = self.phases
        if c._closed:
            self.misuse_value("mark_without_begin", "mark(", phase, ") with no open cycle")
            return
        if phase not in phases:
            self.misuse("unknown_phase", lambda: f"mark({short_repr(phase)}): unknown phase; "
                        f"expected one of {', '.join(phases)}")
            return
        i = len(c._ts) - 1
        expected = phases[i + 1] if i + 1 < self.nphases else "end()"
        self.misuse("wrong_phase_order", lambda: f"mark({short_repr(phase)}) during "
                    f"{phases[i]!r}; expected {expected!r} next")

    def misuse_end(self, reached: int) -> None:
        # Not in Cycle.end: a lambda there would make its variables cells, created on every
        # call of the hot path, not only on this one.
        phases = self.phases
        self.misuse("wrong_phase_order", lambda: f"end() after phase {phases[reached - 1]!r}; "
                    f"expected the cycle to reach {phases[-1]!r} first (phases: "
                    f"{', '.join(phases)}); cycle discarded")

    def internal_error(self, exc: BaseException) -> None:
        try:
            self.errors["internal"] += 1
            self.log.warn("internal", lambda: "internal error on the hot path, ignored: "
                          + short_repr(exc, 200))
        except Exception:
            pass
