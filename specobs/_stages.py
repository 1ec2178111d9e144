"""The resolver's stages, as functions of a chunk and what it needs, plus the two small states
they keep.

A chunk goes through *poll* (:func:`poll`: how far the cycles completed on the GPU), the ring's
own *bucket* pass (``drain_into``), *read* (:func:`read_gpu`: sampled cycles' GPU times),
*validate* (:func:`validate`: what the ring kept as objects), and the rows the aggregation and
the sinks take (:func:`by_draft_length`, :func:`resolved_cycles`). The resolver composes them
(``Resolver._resolve``) and owns the order. :class:`Traces` is head sampling for traces;
:class:`NativeReads` is the state of the ring reading sampled cycles' GPU times itself.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import specobs._acceptance as _acceptance
import specobs._bucketing as _bucketing
import specobs.sampling as sampling
from specobs._acceptance import Record, batch_acceptance, resolved_acceptance
from specobs._bucketing import Bucketed
from specobs._model import Acceptance, BatchAcceptance, ResolvedCycle
from specobs._recorder import short_repr
from specobs._ring import ByDraftLength, Detail, add_stamps_by_k

if TYPE_CHECKING:
    from specobs._recorder import Recorder

__all__ = [
    "IN_FLIGHT_POLLS_BEFORE_QUERY", "NativeReads", "Traces", "bucket", "by_draft_length",
    "poll", "read_gpu", "resolved_cycles", "validate",
]

#: Polls a copy may be first in line, in flight by its sentinel, before the poll also asks the
#: driver about the events after it (what settles a copy whose values never land).
IN_FLIGHT_POLLS_BEFORE_QUERY = 4

_perf = time.perf_counter_ns
T = TypeVar("T")
#: What ``validate`` answers per detail: the acceptance its resolved cycle shows.
Validated = Callable[[Any], "Acceptance | None"]


def or_reference(compiled: Callable[..., T], reference: Callable[..., T], *args: Any) -> T:
    """``compiled(*args)``, or the pure-Python reference's answer if the compiled version
    refused something (:mod:`specobs._bucketing`); looked up per call, so a benchmark can swap
    the module's functions."""
    try:
        return compiled(*args)
    except Exception:
        return reference(*args)


def bucket(values: list[int], bounds: Sequence[float], scale: float = 1e-9) -> Bucketed:
    """``values`` bucketed by ``bounds`` (compiled where built)."""
    return or_reference(_bucketing.bucket, _bucketing.bucket_py, values, bounds, scale)


def poll(ring: Any, clock: Any, chunk: int) -> int:
    """Poll: the index bound below which the first ``chunk`` waiting cycles have completed on
    the GPU (every cycle, when nothing holds an event).

    Only cycles holding events (GPU-sampled, or with a CUDA acceptance copy) are looked at. On
    one stream, events complete in the order they were recorded, so the completed cycles are a
    prefix: the ring's ``poll`` finds its end in one native call. Across streams, every event
    is asked in order."""
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
        # An unfenced copy whose values never land over the sentinel (negative counts): taken
        # as complete once a later fenced copy completed.
        later = next((x[2] for x in held[j + 1:] if x[2] is not None and x[2].fenced), None)
        if later is None or not query(later.event):
            return int(h[0])
    return int(bound)


class NativeReads:
    """Whether, and for which clock, the ring reads sampled cycles' GPU times itself; and its
    counts of those cycles as last taken."""

    def __init__(self) -> None:
        #: The clock the ring reads for (``None``: the ring does not read them).
        self.clock: Any = None
        #: The ring's counters of natively read cycles and their record cost, as last taken.
        self.seen: tuple[int, ...] = (0, 0)

    def bind(self, ring: Any, clock: Any, nphases: int) -> None:
        """Have the ring read sampled cycles' GPU times through the runtime functions the clock
        hands over once its direct path was checked on this thread (``None`` before): those
        cycles then need no Python and are drained with the GIL let go."""
        set_native = getattr(ring, "set_native_events", None)
        if set_native is None:
            return
        args = getattr(clock, "native_event_args", lambda: None)() if clock is not None else None
        if args is not None:
            set_native(*args)
            self.clock = clock
            # The pump parks the event lists it read until it comes back: a quarter of the
            # clock's pool at most, so the worker never finds it dry meanwhile.
            events = getattr(clock, "pool_events", 0)
            ring.park_events = max(1, min(512, events // (nphases + 1) // 4))
            # Every pooled event's handle now, once: the pump finds each sampled cycle's
            # handles in the ring's cache from the first cycles on.
            idle = getattr(clock, "idle_events", None)
            if idle is not None:
                ring.cache_handles(idle())
        elif self.clock is not None:
            set_native()  # the clock it read for is gone (dropped at fork, replaced)
            self.clock = None

    def take(self, counts: tuple[int, ...]) -> tuple[int, int]:
        """Sampled cycles whose GPU times the ring read itself since the last call, and the
        worker's ns recording their events (``counts``: the ring's ``counters()``)."""
        now = (counts[3], counts[4])
        seen = self.seen
        if now == seen:
            return 0, 0
        self.seen = now
        return now[0] - seen[0], now[1] - seen[1]


class Traces:
    """Which cycles become traces: head sampling at ``head_rate``, and every cycle whose GPU
    time reaches ``slow_ns``."""

    def __init__(self, want: bool, head_rate: float, slow_ns: int | None) -> None:
        self.want = want
        self.head_rate = head_rate
        self.slow_ns = slow_ns
        #: The next cycle index head sampling picks.
        self.next = 0
        self.rng = random.Random()

    def reset(self, begun: int) -> None:
        """A forked child: new ids (else parent and child draw the same), picks from ``begun``."""
        self.rng = random.Random()
        self.next = begun

    def head_next(self) -> int:
        """The next cycle head sampling picks, or -1 when it picks none (the pump's argument)."""
        return self.next if self.want and self.head_rate > 0.0 else -1

    def pick(self, bound: int) -> list[int]:
        """The cycle indices below ``bound`` picked for traces: one draw per traced cycle
        (geometric gaps), not one per cycle."""
        if not self.want or self.head_rate <= 0.0:
            return []
        nxt = self.next
        out: list[int] = []
        while nxt < bound:
            out.append(nxt)
            nxt += 1 + sampling.geometric_gap(self.rng.random(), self.head_rate)
        self.next = nxt
        return out

    def ids(self, nph: int) -> dict[str, Any]:
        """Fresh trace, span and phase span ids for one traced cycle."""
        rng = self.rng
        return {"trace_id": rng.getrandbits(128) or 1, "span_id": rng.getrandbits(64) or 1,
                "phase_span_ids": [rng.getrandbits(64) or 1 for _ in range(nph)]}


def read_gpu(
    details: list[Detail], clock: Any, rec: Recorder
) -> tuple[dict[int, list[int]], int, int]:
    """Read: GPU phase times of the sampled cycles (every event of theirs has completed), by
    position in ``details``; the hot-path ns their records cost; the ns reading them took."""
    gpu: dict[int, list[int]] = {}
    cost = 0
    if clock is None:
        return gpu, cost, 0
    t_read = _perf()
    el = clock.elapsed_ns
    for j, d in enumerate(details):
        ev = d.events
        if ev is None:
            continue
        try:
            g = [el(ev[i], ev[i + 1]) for i in range(len(ev) - 1)]
            if all(type(x) is int and x >= 0 for x in g):
                gpu[j] = g
            else:
                refuse_gpu_times(g, clock, rec)
        except Exception as exc:
            rec.log.warn("elapsed", f"could not read GPU event times: {exc!r}")
        clock.release(ev)
        cost += d.cost_ns
    return gpu, cost, _perf() - t_read


def refuse_gpu_times(g: list[Any], clock: Any, rec: Recorder) -> None:
    """A sampled cycle whose GPU times cannot be used: the cycle keeps its host times and
    tokens (counted by the ring already), without GPU times. A negative time -- an end event
    before its start: the GPU clock stepped back, or events recorded out of order -- is counted
    as ``dropped_records{reason="clock_backwards"}``."""
    i, x = next((i, x) for i, x in enumerate(g) if not (type(x) is int and x >= 0))
    phase = rec.phases[i] if i < len(rec.phases) else str(i)
    if type(x) is int:
        rec.drop("clock_backwards", lambda: (
            f"a sampled cycle's GPU events read {x} ns for phase {phase!r}: expected its end "
            f"event at or after its start (elapsed >= 0); the GPU clock stepped back or the "
            f"events were recorded out of order. Counted with its host times and tokens, "
            f"without GPU times (dropped_records{{reason=\"clock_backwards\"}})"))
        return
    rec.log.warn("elapsed", lambda: (
        f"GPU event times must be integer nanoseconds, got {short_repr(x)} for phase "
        f"{phase!r} from {type(clock).__name__}.elapsed_ns; those cycles are counted without "
        f"GPU times"))


def _unread_copy(exc: BaseException) -> Callable[[], str]:
    """The message for a copied acceptance that could not be read, built only if logged."""
    return lambda: "could not read the copied acceptance: " + short_repr(exc, 200)


def validate(
    details: list[Detail], k_max: int, misuse: Callable[[str, Any], None]
) -> tuple[BatchAcceptance | None, list[int], Validated]:
    """Validate: what the ring kept as objects (:mod:`specobs._acceptance`) -- acceptance it
    did not store itself (copies read here first, so they are validated by columns too), and
    batch sizes it did not take. Returns the chunk's acceptance and batch sizes, and what a
    detail's resolved cycle shows (for the details validated here)."""
    recs: list[Record] = []
    position: dict[int, int] = {}  # id(detail) -> its record's position in ``recs``
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
                misuse("bad_acceptance", _unread_copy(exc))
                acc = None
        position[id(d)] = len(recs)
        recs.append(Record(acc, d.draft_length, d.emitted, b))
    if not recs:
        return None, [], lambda d: None
    found = batch_acceptance(recs, k_max, misuse)

    def shown(d: Any) -> Acceptance | None:
        i = position.get(id(d))
        return None if i is None else resolved_acceptance(found, i, recs[i], k_max)

    return found.acceptance, found.batches, shown


def resolved_cycles(
    details: list[Detail], gpu: dict[int, list[int]], validated: Validated, *,
    phases: tuple[str, ...], anchor_ns: int, want_all: bool, traces: Traces,
) -> list[ResolvedCycle]:
    """A :class:`ResolvedCycle` for each traced detail (and each one, when ``want_all``).
    ``anchor_ns``: wall time minus the ring's clock."""
    slow = traces.slow_ns
    nph = len(phases)
    out: list[ResolvedCycle] = []
    for j, d in enumerate(details):
        traced = bool(d.traced)
        g = gpu.get(j)
        if slow is not None and g is not None and sum(g) >= slow:
            traced = True
        if not (want_all or traced):
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
        ids = traces.ids(nph) if traced else {}
        out.append(ResolvedCycle(
            index=d.cycle_index, phases=phases, start_wall_ns=anchor_ns + ts[0],
            end_wall_ns=anchor_ns + ts[-1], host_ns=[ts[i + 1] - ts[i] for i in range(nph)],
            gpu_ns=g, batch_size=batch, **counted, **ids))
    return out


def by_draft_length(
    details: list[Detail], validated: Validated, k_max: int, nph: int,
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
        batch, by_ring = cycle_batch(d, a)
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


def cycle_batch(d: Detail, a: Acceptance | None) -> tuple[int | None, bool]:
    """A detail's batch size as the batch-size histogram counts it (``None``: none), and whether
    the ring counted it (a valid int given, or the sequences of acceptance it stored) rather than
    the resolver's validation (as :func:`validate` chooses: anything else given, or the
    sequences of acceptance validated here, ``a``)."""
    b = d.batch
    given_ok = b is None or (type(b) is int and 0 <= b <= _acceptance.MAX_BATCH)
    if given_ok and (d.native or (d.acceptance is None and d.copy is None)):
        if b is not None:
            return b, True
        return (len(d.acceptance) if d.native else None), True
    if b is not None:
        return _acceptance.batch_size_of(b), False
    return (len(a.lengths) if a is not None else None), False
