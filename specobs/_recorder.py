"""The hot path: what runs on the inference worker's thread at every phase boundary.

Rules this module keeps (and why):

* stdlib only, no imports of torch/numpy: the worker pays for every attribute lookup;
* never raises into the worker: every entry point catches, counts and logs (rate-limited);
* never synchronizes the GPU: CUDA events are *recorded* here and *queried* by the resolver;
* bounded memory: cycles go to a ring whose oldest entry is dropped (and counted) when full.

A cycle is ``begin`` → ``mark(phase)`` for each later phase → ``end``, with ``accept(...)``
anywhere before ``end``. ``begin`` starts the first phase; each ``mark`` ends the running phase and
starts the named one, which must be the next in order; ``end`` ends the last phase. Those calls
are the ring's (:mod:`specobs._ring`; in C where built); this module holds what they call when
something is not common: misuse, a sampled cycle's events, the clock starting, a CUDA copy.
"""

from __future__ import annotations

import logging
import reprlib
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

import specobs._ring as _ring
import specobs.catalog as catalog
from specobs._model import CycleHandle
from specobs.timing._base import record_stream_of

if TYPE_CHECKING:
    from specobs.timing import EventClock

__all__ = ["Cycle", "Message", "Recorder", "short_repr"]

if TYPE_CHECKING:
    from specobs._ring import PyCycle as Cycle
else:
    #: The type of the handles ``begin`` returns (native where built; see :mod:`specobs._ring`).
    Cycle = _ring.Cycle

_log = logging.getLogger("specobs")
_perf = time.perf_counter_ns
_LOG_EVERY_NS = 60 * 1_000_000_000


def _nothing() -> None:
    pass


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


class _NullCycle(CycleHandle):
    """What the hot path returns before configure and after shutdown: the protocol's own no-op
    bodies, so it takes exactly the arguments every handle takes."""

    index = -1

    def defer(self) -> _NullCycle:
        return self

    def __enter__(self) -> _NullCycle:
        return self


NULL_CYCLE = _NullCycle()


class _QuietSlow:
    """The recorder side of a scratch ring that only ever sees well-formed cycles."""

    def wake(self) -> None:
        pass

    def queue_full(self) -> None:
        pass


_BOUNDARY_NS: dict[tuple[Any, tuple[str, ...]], float] = {}


def boundary_ns(ring_type: Any, phases: tuple[str, ...]) -> float:
    """Nanoseconds one phase boundary (``begin``, a ``mark``, ``end``; list acceptance spread
    over them) costs the calling thread with ``ring_type``: the fastest of five timed runs of
    200 well-formed cycles on a scratch ring, once per process, ring type and phase count
    (0.2 ms with the native ring). Used for the self-reported overhead, not for sampling."""
    key = (ring_type, phases)
    got = _BOUNDARY_NS.get(key)
    if got is not None:
        return got
    ring = ring_type(_QuietSlow(), phases, 512, 8, 1 << 20, catalog.DURATION_BUCKETS_SECONDS,
                     catalog.BATCH_SIZE_BUCKETS, NULL_CYCLE)
    later = phases[1:]
    acc = [1, 0, 2, 3, 0, 1, 4, 2]
    best = float("inf")
    for _ in range(5):
        t = _perf()
        for _ in range(200):
            c = ring.begin(8)
            for p in later:
                c.mark(p)
            c.accept(acc, draft_length=4)
            c.end()
        best = min(best, (_perf() - t) / 200)
        ring.clear_queue()
    got = best / (len(phases) + 1)
    _BOUNDARY_NS[key] = got
    return got


class _RingCount:
    """A count the ring keeps (of the same name), read through the recorder as an ``int``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, recorder: Recorder, owner: type | None = None) -> int:
        return int(getattr(recorder.ring, self.name))

    def __set__(self, recorder: Recorder, value: int) -> None:
        raise AttributeError(f"{self.name} is the ring's count, read-only")


class Recorder:
    """Hot-path state of one observer: the ring the worker writes (:mod:`specobs._ring`, native
    where built) and the slow paths it calls (misuse, sampled cycles, the clock starting, CUDA
    acceptance copies). The worker's calls are the ring's (``begin``) and its handles'
    (``mark``, ``accept``, ``end``); nothing here runs per cycle unless a cycle is sampled or
    misused."""

    def __init__(
        self,
        phases: tuple[str, ...],
        *,
        queue_size: int,
        sample_every: int | None,
        clock: EventClock | None,
        clock_factory: Any = None,
        max_draft_length: int = 8,
        duration_bounds: Sequence[float] = catalog.DURATION_BUCKETS_SECONDS,
        native: bool | None = None,
    ) -> None:
        self.phases = phases
        self.nphases = len(phases)
        self.queue_size = queue_size
        self.max_draft_length = max_draft_length
        self.log = RateLimitedLog()
        self.wake: Any = _nothing
        # defaultdict: ``errors[kind] += 1`` runs no Python code between the read and the
        # write, so under the GIL an increment is never lost to the resolver thread's (which
        # counts bad values here too) or to another thread's.
        self.errors: defaultdict[str, int] = defaultdict(int)
        self.dropped_pool = 0
        self.dropped_capture = 0
        #: Other losses counted in Python, by ``dropped_records`` reason (:meth:`drop`).
        self.drops: defaultdict[str, int] = defaultdict(int)
        #: Moves after each change of ``errors``, ``drops``, ``dropped_pool`` or
        #: ``dropped_capture``: the resolver folds them only when it moved (the ring's own
        #: counts it reads in one call).
        self.changes = 0
        if native is None:
            native = _ring.NATIVE
        if native and not _ring.BUILT:
            raise RuntimeError("the native core is not built")
        ring_type: Any = _ring.NativeRing if native else _ring.PyRing
        #: ``"native"`` or ``"python"``: which ring runs (``specobs_info{core}``).
        self.core = "native" if native else "python"
        self.ring = ring_type(
            self, tuple(phases), queue_size, max_draft_length, max(16, min(1024, queue_size // 4)),
            tuple(duration_bounds), tuple(catalog.BATCH_SIZE_BUCKETS), NULL_CYCLE,
        )
        #: What one phase boundary costs the worker on this machine with this ring (measured
        #: once per ring type and phase count): the host part of the self-reported overhead.
        self.boundary_ns = boundary_ns(ring_type, tuple(phases))
        #: ``begin(batch_size=None)``: the ring's own method (no Python frame on the hot path).
        self.begin = self.ring.begin
        self.sample_every = sample_every
        self.ring.interval = sample_every if sample_every is not None else 1
        self.clock: EventClock | None = None
        self._clock_factory = clock_factory
        if clock is not None:
            self._set_clock(clock)
        elif clock_factory is not None:
            self.ring.clock_try_at = 0

    # -- what the observer and the resolver read -------------------------------------------------
    @property
    def enabled(self) -> bool:
        return bool(self.ring.enabled)

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self.ring.enabled = int(bool(value))

    @property
    def current(self) -> Any:
        return self.ring.current

    @property
    def interval(self) -> int:
        return int(self.ring.interval)

    @interval.setter
    def interval(self, value: int) -> None:
        self.ring.interval = max(1, int(value))

    @property
    def stream(self) -> Any:
        return self.ring.stream

    @stream.setter
    def stream(self, value: Any) -> None:
        self.ring.stream = value

    begun = _RingCount()
    enqueued = _RingCount()
    dropped_queue_full = _RingCount()
    discarded = _RingCount()
    excepted = _RingCount()
    copy_ns = _RingCount()

    def _set_clock(self, clock: EventClock) -> None:
        self.clock = clock
        ring = self.ring
        ring.record_fn = clock.record_fn
        ring.stream = record_stream_of(clock)
        ring.sampling = 1
        ring.clock_try_at = -1
        # Completed copies of this type are read by the ring's drain straight from pinned
        # memory (no Python object per copy); anything else goes through ``copy.read()``.
        ring.copy_type = getattr(clock, "native_copy_type", None)
        # The native core starts acceptance copies itself where the clock can hand it the
        # runtime's functions (the pure-Python ring always calls ``copy_to_host``).
        native = getattr(clock, "native_copy_args", None)
        args = native() if callable(native) else None
        if args is not None and hasattr(ring, "set_native_copy"):
            ring.set_native_copy(*args)
        self._clock_factory = None

    def drop_clock(self) -> None:
        """Host clock only from now on (a forked child, where CUDA cannot be used): no sampled
        events, no acceptance copies (native ones off too), no clock tried again."""
        self.clock = None
        ring = self.ring
        ring.sampling = 0
        ring.record_fn = None
        ring.copy_type = None
        ring.clock_try_at = -1
        if hasattr(ring, "set_native_copy"):
            ring.set_native_copy()
        if hasattr(ring, "set_native_events"):
            ring.set_native_events()
        self._clock_factory = None

    # -- slow paths, called by the ring on the worker's thread -----------------------------------
    def try_clock(self, idx: int) -> None:
        """Lazy CUDA start: only once the engine has initialised CUDA itself. Retried every 256
        cycles, so a CPU-only process pays one comparison per cycle in C."""
        self.ring.clock_try_at = idx + 256
        factory = self._clock_factory
        clock = factory() if factory is not None else None
        if clock is not None:
            self._set_clock(clock)

    def sample(self, t: int) -> Any:
        """A sampled cycle begins at ``t``: its events with the first recorded, ``False`` inside
        CUDA graph capture (nothing is real there: not a cycle, not a timing), ``None`` when the
        pool ran dry (counted; events come back when the resolver drains)."""
        clock = self.clock
        if clock is None:
            return None
        if clock.capturing():
            self.dropped_capture += 1
            self.changes += 1
            return False
        ev = clock.acquire(self.nphases + 1)
        if ev is None:
            self.dropped_pool += 1
            self.changes += 1
            self.wake()
            return None
        self.ring.record_fn(ev[0], self.ring.stream)
        return ev

    def copy_to_host(self, tensor: Any) -> Any:
        clock = self.clock
        if clock is None:
            self.misuse("bad_acceptance", "a CUDA tensor was given but no CUDA clock is active; "
                        "acceptance for this cycle is not counted")
            return None
        copy = clock.copy_to_host(tensor)
        if getattr(clock, "buffers_low", False):
            clock.buffers_low = False
            self.wake()
        if copy is None:
            # Pinned buffers come back when the resolver reads them: ask it to run now (at
            # thousands of cycles a second, the 100 ms poll holds more copies than buffers).
            self.wake()
            self.misuse("bad_acceptance", "could not copy the CUDA acceptance tensor (no free "
                        "pinned buffer or event, unsupported dtype, or too many sequences)")
        return copy

    def copy_event_failed(self, slot: Any) -> None:
        """The native core started a copy but the runtime refused the event after it."""
        clock = self.clock
        if clock is not None:
            clock.copy_event_failed(slot)  # type: ignore[attr-defined]

    def oversized(self, kind: str, got: int, bound: int) -> None:
        """A cycle's acceptance refused for its size (the ring's ``_refuse_payload``): counted as
        ``dropped_records{reason="oversized"}``; the cycle keeps its times."""
        if kind == "sequences":
            what = (f"accept() with {got} values in one list: more than max_cycle_sequences="
                    f"{bound} (SPECOBS_MAX_CYCLE_SEQUENCES)")
        else:
            what = (f"the acceptance waiting cycles keep for the resolver would hold {got} bytes: "
                    f"more than max_queue_bytes={bound} (SPECOBS_MAX_QUEUE_BYTES; the resolver "
                    f"is behind, or cycles carry large lists it must validate)")
        self.drop("oversized", what + "; the cycle is counted with its times, without its "
                  "tokens (dropped_records{reason=\"oversized\"})")

    def queue_full(self) -> None:
        self.log.warn("queue_full", "record queue full; dropping the oldest cycle records (the "
                      "resolver is not keeping up)")

    def misuse(self, kind: str, message: Message) -> None:
        """Count one ``errors{kind}`` and log it, rate-limited. Called on the worker's thread
        (the hot path) and the resolver's (bad values): pass the message as a callable when
        building it costs anything (a caller's value: always through :func:`short_repr`), so
        a suppressed line never builds it."""
        self.errors[kind] += 1
        self.changes += 1
        self.log.warn(kind, message)

    def drop(self, reason: str, message: Message, n: int = 1) -> None:
        """Count ``n`` losses as ``dropped_records{reason}`` (one of ``catalog.DROP_REASONS``)
        and log it, rate-limited, as :meth:`misuse` does."""
        self.drops[reason] += n
        self.changes += 1
        self.log.warn(reason, message)

    def misuse_value(self, kind: str, before: str, value: Any, after: str = "") -> None:
        """:meth:`misuse` with a message showing a caller's ``value`` between ``before`` and
        ``after``, through :func:`short_repr`, built only if the line is emitted."""
        self.misuse(kind, lambda: before + short_repr(value) + after)

    def misuse_mark(self, closed: bool, phase: Any, reached: int | None) -> None:
        """``mark(phase)`` refused: on a closed cycle, or not the next phase (``reached``
        stamps were taken)."""
        phases = self.phases
        if closed or reached is None:
            self.misuse_value("mark_without_begin", "mark(", phase, ") with no open cycle")
            return
        try:
            known = phase in phases
        except Exception:
            known = False
        if not known:
            self.misuse("unknown_phase", lambda: f"mark({short_repr(phase)}): unknown phase; "
                        f"expected one of {', '.join(phases)}")
            return
        i = reached - 1
        expected = phases[i + 1] if i + 1 < self.nphases else "end()"
        self.misuse("wrong_phase_order", lambda: f"mark({short_repr(phase)}) during "
                    f"{phases[i]!r}; expected {expected!r} next")

    def misuse_end(self, reached: int) -> None:
        phases = self.phases
        self.misuse("wrong_phase_order", lambda: f"end() after phase {phases[reached - 1]!r}; "
                    f"expected the cycle to reach {phases[-1]!r} first (phases: "
                    f"{', '.join(phases)}); cycle discarded")

    def internal_error(self, exc: BaseException) -> None:
        try:
            self.errors["internal"] += 1
            self.changes += 1
            self.log.warn("internal", lambda: "internal error on the hot path, ignored: "
                          + short_repr(exc, 200))
        except Exception:
            pass
