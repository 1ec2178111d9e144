"""The native ring (specobs/_core/) against its specification (specobs/_ring.py).

Random cycle streams -- every kind of accept() input, misuse, exceptions inside a cycle, a full
ring, sampled cycles with events, CUDA copies, graph capture, traced and slow cycles, drains at
random points, clearing as after fork -- go through both implementations with the same fake
clock (``tick``: every clock read advances a counter), and every chunk, every detail, every
counter and every call into the recorder must be identical.
"""

from __future__ import annotations

import array
import ast
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

try:
    import torch
except ImportError:  # the sanitizer run (tests/test_core_memory.py) leaves torch out
    torch = None

from specobs import _ring, catalog
from specobs._recorder import NULL_CYCLE

pytestmark = pytest.mark.skipif(not _ring.BUILT, reason="the native core is not built here")

PHASES = ("draft", "verify", "bookkeeping")
K_MAX = 6


class FakeCuda:
    """A tensor that says it is on a GPU (the recorder's copy_to_host is the slow path)."""

    is_cuda = True

    def __init__(self, values: list[int]) -> None:
        self.values = values

    def numel(self) -> int:
        return len(self.values)


class Copy:
    def __init__(self, n: int) -> None:
        self.n = n
        self.event = ("copy", n)

    def __repr__(self) -> str:
        return f"Copy({self.n})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Copy) and other.n == self.n

    __hash__ = None  # type: ignore[assignment]


class Slow:
    """The recorder's side of the ring, recording every call in order."""

    def __init__(self, rng: random.Random) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.rng = rng
        self.events = 0
        self.copies = 0
        self.ring: Any = None

    def misuse(self, kind: str, message: Any) -> None:
        self.calls.append(("misuse", kind))

    def misuse_mark(self, closed: bool, phase: Any, reached: Any) -> None:
        self.calls.append(("misuse_mark", bool(closed), repr(phase), reached))

    def misuse_end(self, reached: int) -> None:
        self.calls.append(("misuse_end", reached))

    def internal_error(self, exc: BaseException) -> None:
        self.calls.append(("internal", type(exc).__name__))

    def queue_full(self) -> None:
        self.calls.append(("queue_full",))

    def oversized(self, kind: str, got: int, bound: int) -> None:
        self.calls.append(("oversized", kind, got, bound))

    def wake(self) -> None:
        self.calls.append(("wake",))

    def try_clock(self, idx: int) -> None:
        self.calls.append(("try_clock", idx))
        self.ring.clock_try_at = idx + 3
        if self.rng.random() < 0.3:
            self.ring.sampling = 1
            self.ring.clock_try_at = -1

    def sample(self, t: int) -> Any:
        self.calls.append(("sample", t))
        u = self.rng.random()
        if u < 0.1:
            return False  # graph capture
        if u < 0.2:
            return None  # pool dry
        self.events += 1
        ev = [("ev", self.events, i) for i in range(len(PHASES) + 1)]
        self.ring.record_fn(ev[0], self.ring.stream)
        return ev

    def copy_to_host(self, tensor: Any) -> Any:
        self.calls.append(("copy", len(tensor.values)))
        if self.rng.random() < 0.3:
            return None
        self.copies += 1
        return Copy(self.copies)


def _record(ev: Any, stream: Any) -> None:
    pass


def make(kind: str, seed: int, capacity: int) -> tuple[Any, Slow]:
    slow = Slow(random.Random(seed))
    cls = _ring.NativeRing if kind == "native" else _ring.PyRing
    ring = cls(slow, PHASES, capacity, K_MAX, 3, catalog.DURATION_BUCKETS_SECONDS,
               catalog.BATCH_SIZE_BUCKETS, NULL_CYCLE)
    slow.ring = ring
    ring.tick = 997  # ns per clock read: durations cross bucket bounds as the stream goes on
    ring.record_fn = _record
    ring.stream = "stream"
    return ring, slow


def make_random(
    kind: str, seed: int, rng: random.Random, capacities: list[int], sampled: float,
    intervals: list[int],
) -> tuple[Any, Slow]:  # fmt: skip
    """``make`` with a capacity drawn from ``capacities``; with chance ``sampled``, every cycle
    sampled, one in an interval drawn from ``intervals`` GPU-timed."""
    ring, slow = make(kind, seed, rng.choice(capacities))
    if rng.random() < sampled:
        ring.sampling = 1
        ring.interval = rng.choice(intervals)
    return ring, slow


def acceptance_input(rng: random.Random) -> tuple[Any, dict[str, Any]]:
    """Something a caller may pass to accept(), good or bad, with keywords."""
    n = rng.choice([0, 1, 3, 8])
    k = rng.choice([None, None, 2, 4, K_MAX, K_MAX + 3, -1])
    top = K_MAX if k is None else max(0, k)
    vals = [rng.randint(0, top) for _ in range(n)]
    if rng.random() < 0.1 and vals:
        vals[rng.randrange(n)] = rng.choice([top + 1, -1, True, 2.0, 2.5, "1", None, 1 << 70])
    form = rng.choice(["list", "list", "tuple", "np64", "np32", "npbool", "npfloat", "array",
                       "tensor", "cuda", "range", "scalar", "object", "bytes"])
    kw: dict[str, Any] = {}
    if k is not None:
        kw["draft_length"] = k
    if rng.random() < 0.1:
        kw["draft_length"] = [top] * n
    if rng.random() < 0.1:
        kw["emitted"] = n + 1
    if rng.random() < 0.2:
        kw["batch_size"] = rng.choice([n, 16, 0, -3, True, 2.0, "8", 1 << 40])
    clean = all(type(v) is int for v in vals)
    if form == "tuple":
        return tuple(vals), kw
    if form in ("np64", "np32") and clean and all(0 <= v < 1 << 31 for v in vals):
        return np.array(vals, dtype=np.int64 if form == "np64" else np.int32), kw
    if form == "npbool" and clean:
        return np.array([bool(v) for v in vals], dtype=bool), kw
    if form == "npfloat" and clean:
        return np.array(vals, dtype=np.float64), kw
    if form == "array" and clean and all(0 <= v < 1 << 62 for v in vals):
        return array.array("q", vals), kw
    if form == "tensor" and torch is not None and clean and all(abs(v) < 1 << 31 for v in vals):
        return torch.tensor(vals, dtype=torch.int64), kw
    if form == "cuda" and clean:
        return FakeCuda(vals), kw
    if form == "range":
        return range(n), kw
    if form == "scalar":
        return rng.choice([3, np.int64(2)]), kw
    if form == "object":
        return object(), kw
    if form == "bytes":
        return bytes(min(max(v, 0), 255) for v in vals if type(v) is int), kw
    return vals, kw


def normalise(x: Any) -> Any:
    """Chunks with what the caller passed replaced by comparable values."""
    if isinstance(x, list):
        return [normalise(v) for v in x]
    if isinstance(x, tuple):  # a named tuple (the twin's RingTotals) as the plain one C returns
        return tuple(normalise(v) for v in x)
    if isinstance(x, dict):
        return {k: normalise(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype.str, x.tolist())
    if torch is not None and isinstance(x, torch.Tensor):
        return ("tensor", x.tolist())
    if isinstance(x, array.array):
        return ("array", x.tolist())
    if isinstance(x, (FakeCuda, range)) or type(x) is object:
        return ("obj", type(x).__name__)
    return x


def run_stream(kind: str, seed: int) -> list[Any]:
    rng = random.Random(seed)
    capacity = rng.choice([4, 16, 64])
    ring, slow = make(kind, seed, capacity)
    # Gaps between cycles over this many ns are idle: never, or often (a clock read is 997 ns).
    # Drawn apart, so that the stream itself stays what each seed made it.
    ring.idle_gap_ns = [1 << 40, 6 * 997, 30 * 997][seed % 3]
    if seed % 4 == 1:  # small bounds on what a cycle carries: some refused (oversized)
        ring.max_cycle_sequences = 5
        ring.max_queue_bytes = 200
    if rng.random() < 0.5:
        ring.sampling = 1
        ring.interval = rng.choice([1, 2, 5])
    else:
        ring.clock_try_at = 0
    log: list[Any] = []
    handles: list[Any] = []
    for step in range(400):
        u = rng.random()
        c = handles[-1] if handles else None
        if u < 0.15 or c is None:
            b = rng.choice([None, None, 4, 8, True, -1, 2.5])
            c = ring.begin(b) if b is not None else ring.begin()
            handles = [*handles[-3:], c]
        elif u < 0.45:
            phase = rng.choice([*PHASES[1:], *PHASES[1:], "draft", "nope", 3, None])
            rng.choice(handles).mark(phase) if rng.random() < 0.1 else c.mark(phase)
        elif u < 0.6:
            acc, kw = acceptance_input(rng)
            c.accept(acc, **kw)
        elif u < 0.75:
            rng.choice(handles).end() if rng.random() < 0.1 else c.end()
        elif u < 0.8:
            try:
                with c:
                    if rng.random() < 0.5:
                        raise RuntimeError("engine failure")
            except RuntimeError:
                pass
        elif u < 0.83:
            # A whole well-formed cycle as an engine runs it.
            with ring.begin(8) as cc:
                cc.mark("verify")
                cc.mark("bookkeeping")
                cc.accept([rng.randint(0, 4) for _ in range(8)], draft_length=4)
        elif u < 0.95:
            held, bound = ring.pending(rng.choice([1, 4, 32]))
            if held and rng.random() < 0.5:
                bound = held[rng.randrange(len(held))][0]  # that one has not completed
            trace = sorted(rng.sample(range(max(bound, 1)), min(3, max(bound, 1))))
            args = (bound, rng.choice([2, 8, 1000]), trace, rng.choice([-1, 5000, 3 * 997]),
                    rng.random() < 0.2)
            log.append(("pending", normalise(held), bound))
            if rng.random() < 0.5:
                log.append(("drain", normalise(_ring.Drained._make(ring.drain(*args)))))
            else:  # into the running totals, as the resolver drains
                log.append(("drain_into", normalise(ring.drain_into(*args))))
                log.append(("totals", normalise(ring.totals()), ring.drained))
        elif u < 0.97:
            log.append(("dropped", normalise(ring.take_dropped())))
        elif u < 0.98:
            log.append(("clear", ring.clear_queue()))
            ring.forget_current()
        else:
            ring.interval = rng.choice([1, 3])
        log.append(("counters", step, ring.begun, ring.enqueued, ring.dropped_queue_full,
                    ring.discarded, ring.copy_ns, len(ring), ring.current is not None,
                    ring.held_cycles, len(ring.pending(1 << 30)[0]), ring.poll(8, None, 4),
                    ring.queued_bytes))
    log.append(("final", normalise(ring.drain_into(1 << 60, 1 << 30, [], -1, True))))
    log.append(("totals", normalise(ring.totals()), ring.drained))
    ring.clear_queue()
    log.append(("queued_bytes", ring.queued_bytes))  # nothing kept: all given back
    ring.reset_totals()
    log.append(("reset", normalise(ring.totals())))
    log.append(("calls", slow.calls))
    return log


@pytest.mark.parametrize("seed", range(60))
def test_native_ring_equals_its_specification(seed):
    native = run_stream("native", seed)
    python = run_stream("python", seed)
    assert len(native) == len(python)
    for a, b in zip(native, python, strict=True):
        assert a == b
    # The count of waiting cycles holding events or a copy (what lets the poll skip its walk)
    # is what a walk of the ring finds, after every step.
    counters = [e for e in native if e[0] == "counters"]
    assert counters and all(e[9] == e[10] for e in counters)
    assert any(e[9] > 0 for e in counters)
    assert ("queued_bytes", 0) in native


def test_the_streams_exercise_every_path():
    """The random streams above reach what they are meant to compare: details of every kind,
    drops, misuse of every kind, copies and captures (so a test that compares nothing fails)."""
    seen: set[str] = set()
    for seed in range(60):
        for entry in run_stream("native", seed):
            if entry[0] == "drain_into":
                seen.add("drain_into")
            if entry[0] == "drain":
                out = entry[1]
                if out[0]:
                    seen.add("resolved")
                for d in out[11]:
                    seen.add("native-detail" if d[9] else "object-detail")
                    if d[3] is not None:
                        seen.add("events")
                    if d[8] is not None:
                        seen.add("copy")
                    if d[10]:
                        seen.add("traced")
                if out[8]:
                    seen.add("acceptance")
                if out[14][1]:
                    seen.add("gaps")
                if out[15]:
                    seen.add("idle-gaps")
            elif entry[0] == "calls":
                seen.update(str(c[0]) + (":" + str(c[1]) if c[0] in ("misuse", "oversized")
                                         else "") for c in entry[1])
            elif entry[0] == "dropped" and entry[1]:
                seen.add("dropped-held")
    for want in ("drain_into", "resolved", "native-detail", "object-detail", "events", "copy",
                 "traced", "acceptance", "misuse_mark", "misuse_end", "queue_full", "wake",
                 "oversized:sequences", "oversized:bytes",
                 "sample",
                 "try_clock", "misuse:begin_while_open", "misuse:end_without_begin",
                 "misuse:bad_acceptance", "dropped-held", "gaps", "idle-gaps"):
        assert want in seen, want


def test_a_handle_kept_after_end_is_never_reused_and_never_writes():
    for kind in ("native", "python"):
        ring, slow = make(kind, 0, 8)
        kept = ring.begin(4)
        kept.mark("verify")
        kept.mark("bookkeeping")
        kept.end()
        fresh = ring.begin(4)
        assert fresh is not kept
        kept.mark("verify")  # a stale handle: counted, and the open cycle is untouched
        kept.accept([1, 1, 1, 1], draft_length=4)
        kept.end()
        fresh.mark("verify")
        fresh.mark("bookkeeping")
        fresh.end()
        out = _ring.Drained._make(ring.drain(1 << 60, 100, [], -1, True))
        assert out.cycles == 2
        assert [d.acceptance for d in out.details] == [None, None]  # none landed on either
        assert ("misuse_mark", True, "'verify'", None) in slow.calls
        assert ("misuse", "end_without_begin") in slow.calls
        # The handle of a cycle nobody kept is reused: no object per cycle in a steady loop.
        del kept
        a = ring.begin()
        ida = id(a)
        a.end()
        del a
        b = ring.begin()
        assert id(b) == ida, kind


class QuietSlow:
    """A recorder that is never called in a steady loop (asserted: every call would raise)."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the ring called {name} in a steady loop")


@pytest.mark.parametrize("kind", ["native", "python"])
def test_a_steady_loop_reuses_its_handle_and_slots(kind):
    """No object per cycle once the ring has wrapped (native: nothing allocated at all; the
    twin allocates its stamp lists, untracked by the garbage collector)."""
    import gc
    import sys

    cls = _ring.NativeRing if kind == "native" else _ring.PyRing
    ring = cls(QuietSlow(), PHASES, 64, K_MAX, 1 << 20, catalog.DURATION_BUCKETS_SECONDS,
               catalog.BATCH_SIZE_BUCKETS, NULL_CYCLE)
    acc = [1, 2, 0, 3, 4, 1, 0, 2]

    def loop(n: int) -> None:
        for _ in range(n):
            with ring.begin(8) as c:
                c.mark("verify")
                c.mark("bookkeeping")
                c.accept(acc, draft_length=4)
            out = ring.drain(1 << 60, 1 << 20, [], -1, False) if ring.queued() >= 32 else None
            del out

    loop(200)  # every slot used once
    gc.collect()
    before = sys.getallocatedblocks()
    counts = gc.get_count()[0]
    loop(1)
    with ring.begin(8) as c:
        handle = id(c)
        c.mark("verify")
        c.mark("bookkeeping")
    del c
    loop(5000)
    assert gc.get_count()[0] - counts < 200  # not one tracked object per cycle (5,000)
    if kind == "native":
        assert sys.getallocatedblocks() - before < 100  # not one block per cycle (5,000)
    c = ring.begin()
    assert id(c) == handle  # the same handle, handed out again


class PinnedCopy:
    """A completed copy as the CUDA clock's pinned slots are: ``ptr``, ``itemsize`` and
    ``length`` as member slots over real memory (here a ctypes array)."""

    __slots__ = ("_mem", "event", "itemsize", "length", "ptr", "released")

    def __init__(self, values: list[int], itemsize: int) -> None:
        import ctypes

        ctype = ctypes.c_int64 if itemsize == 8 else ctypes.c_int32
        self._mem = (ctype * max(len(values), 1))(*values)
        self.ptr = ctypes.addressof(self._mem)
        self.itemsize = itemsize
        self.length = len(values)
        self.event = ("copy", id(self))
        self.released = 0

    def release(self) -> None:
        self.released += 1

    def read(self) -> list[int]:
        self.release()
        return list(self._mem[: self.length])


@pytest.mark.parametrize("kind", ["native", "python"])
def test_completed_pinned_copies_are_read_by_the_drain_itself(kind):
    """Copies of the clock's pinned type are read from memory in the drain: counted with no
    detail when valid, handed to the resolver as a list to validate when not (a value above the
    draft length, or per-sequence draft lengths), and every copy comes back to be released."""
    copies = {
        1: PinnedCopy([1, 2, 0, 3], 8),
        2: PinnedCopy([4, 4], 4),
        3: PinnedCopy([1, 9], 8),  # 9 > k: the resolver validates it (and counts it bad)
        4: PinnedCopy([1, 1], 8),
    }

    order = iter(copies.values())

    class CopySlow(Slow):
        def copy_to_host(self, tensor: Any) -> Any:
            return next(order)

    slow = CopySlow(random.Random(0))
    cls = _ring.NativeRing if kind == "native" else _ring.PyRing
    ring = cls(slow, PHASES, 16, K_MAX, 1000, catalog.DURATION_BUCKETS_SECONDS,
               catalog.BATCH_SIZE_BUCKETS, NULL_CYCLE)
    slow.ring = ring
    ring.tick = 1000
    ring.copy_type = PinnedCopy
    for vals, kw in [([0] * 4, {"draft_length": 4}), ([0] * 2, {}),
                     ([0] * 2, {"draft_length": 4}), ([0] * 2, {"draft_length": [2, 2]})]:
        with ring.begin() as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept(FakeCuda(vals), **kw)
    out = _ring.Drained._make(ring.drain(1 << 60, 100, [], -1, False))
    details = out.details
    assert out.cycles == 4
    assert (out.accepted, out.drafted, out.emitted) == (6 + 8, 16 + 2 * K_MAX, 6 + 4 + 8 + 2)
    assert out.sequences_by_draft_length == {4: 4, K_MAX: 2}
    assert out.sequences_by_accepted[:5] == [1, 1, 1, 1, 2]
    assert out.batches == 2  # the two native ones; the others are sized by the resolver
    assert all(type(d) is _ring.Detail for d in details)  # both rings hand the named class over
    assert [d.acceptance for d in details] == [[1, 9], [1, 1]]  # for the resolver to validate
    assert [d.copy for d in details] == [None, None]  # read already: no copy left to read
    assert [d.draft_length for d in details] == [4, [2, 2]]
    assert out.released == [copies[1], copies[2], copies[3], copies[4]]
    assert all(c.released == 0 for c in copies.values())  # the resolver releases them


@pytest.mark.parametrize("kind", ["native", "python"])
@pytest.mark.parametrize("bad", ["itemsize", "ptr", "length"])
def test_a_pinned_copy_the_drain_cannot_read_stays_for_the_resolver(kind, bad):
    """A copy of the pinned type with no buffer, 2-byte elements or a length past 2**20 is not
    read from memory: it stays on its cycle for the resolver (which reads it in Python and
    says why not), is not released by the drain, and the good copy beside it is read."""
    good, broken = PinnedCopy([1, 2], 8), PinnedCopy([3, 1], 8)
    if bad == "itemsize":
        broken.itemsize = 2
    elif bad == "ptr":
        broken.ptr = 0
    else:
        broken.length = (1 << 20) + 1
    ring, slow = make(kind, 3, 8)
    ring.record_fn = None  # no sampled cycle: only the copies
    started = iter([good, broken])
    slow.copy_to_host = lambda tensor, it=started: next(it)  # type: ignore[method-assign]
    ring.copy_type = PinnedCopy
    for _ in range(2):
        with ring.begin(2) as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept(FakeCuda([0, 0]))
    out = _ring.Drained._make(ring.drain(1 << 60, 8, [], -1, False))
    assert out.cycles == 2
    assert out.accepted == 3  # the good copy's, read natively
    assert [d.copy for d in out.details] == [broken]  # left to read
    assert out.released == [good]


@pytest.mark.parametrize("kind", ["native", "python"])
def test_a_drain_is_read_by_name_on_both_rings(kind):
    """The twin's ``drain`` returns a :class:`~specobs._ring.Drained`; the native ring returns
    the same fields in the same order as a plain tuple, which ``Drained._make`` names. Each
    field holds what its name says."""
    ring, _slow = make(kind, 1, 8)
    ring.record_fn = None  # no sampled cycle: nothing needs Python
    with ring.begin(3) as c:
        c.mark("verify")
        c.mark("bookkeeping")
        c.accept([2, 0, 4], draft_length=4)
    with ring.begin() as c:
        c.mark("verify")
        c.mark("bookkeeping")
        c.accept([1], draft_length=2)
    raw = ring.drain(1 << 60, 8, [], -1, False)
    assert len(raw) == len(_ring.Drained._fields)
    assert (type(raw) is _ring.Drained) == isinstance(ring, _ring.PyRing)
    out = _ring.Drained._make(raw)
    assert out.cycles == 2
    assert (out.accepted, out.drafted, out.emitted) == (7, 3 * 4 + 2, 7 + 4)
    assert out.sequences_by_draft_length == {2: 1, 4: 3}
    assert out.sequences_by_accepted == [1, 1, 1, 0, 1, 0, 0]  # lengths 0, 1, 2 and 4
    assert out.batches == 2 and out.batch[1] == 3 + 1  # the second sized by its sequences
    assert out.by_draft_length[0] == {2: 1, 4: 1}  # cycles by their draft length
    assert len(out.host) == len(PHASES) + 1
    assert all(sum(counts) == 2 for counts, _ in out.host)
    assert out.host_cycle_ns == out.host[-1][1] > 0
    assert isinstance(out.last_end_ns, int)
    assert (out.details, out.released) == ([], [])
    assert (sum(out.gap[0]), out.idle_gaps) == (1, 0)  # the second cycle's gap, same thread


@pytest.mark.parametrize("pinned_type", [True, False], ids=["pinned-type", "landed-method"])
def test_the_poll_reads_recorder_started_copies_landing_over_the_sentinel(pinned_type):
    """Copies the recorder started (not the native core) and filled with the sentinel: the poll
    counts a cycle complete once its copy's values landed over it, and the cycles before it
    with it (stream order). For the clock's pinned type the native core reads the buffer
    itself (its ptr, itemsize and length), for any other copy it asks ``landed()``; both rings
    give the same bounds as the copies land one by one, and neither asks the driver."""
    from specobs.timing.fake import FakeEvent, _FakePinnedSlot

    bounds = {}
    for kind in ("native", "python"):
        free: list[Any] = []
        slots = [_FakePinnedSlot(4, FakeEvent(), 1000 + i, free) for i in range(3)]
        for slot in slots:
            slot.length = 2
            slot.sentinel = True
            slot.fenced = False
            slot._host[0] = slot._host[1] = -1  # every byte 0xFF: nothing landed
        slow = Slow(random.Random(0))
        started = iter(slots)
        slow.copy_to_host = lambda tensor, it=started: next(it)  # type: ignore[method-assign]
        cls = _ring.NativeRing if kind == "native" else _ring.PyRing
        ring = cls(slow, PHASES, 16, K_MAX, 1 << 20, catalog.DURATION_BUCKETS_SECONDS,
                   catalog.BATCH_SIZE_BUCKETS, NULL_CYCLE)
        slow.ring = ring
        if pinned_type:
            ring.copy_type = _FakePinnedSlot
        for _ in slots:
            with ring.begin(2) as c:
                c.mark("verify")
                c.mark("bookkeeping")
                c.accept(FakeCuda([0, 0]))
        asked: list[Any] = []
        query = lambda event, asked=asked: asked.append(event) or False  # noqa: E731
        seen = [ring.poll(8, query, 1 << 20)]
        for slot, values in zip(slots, ([1, 0], [2, 2], [0, 3]), strict=True):
            slot._host[0] = values[0]  # half the copy: still in flight
            seen.append(ring.poll(8, query, 1 << 20))
            slot._host[1] = values[1]
            seen.append(ring.poll(8, query, 1 << 20))
        assert asked == [], kind
        bounds[kind] = seen
    assert bounds["native"] == bounds["python"] == [0, 0, 1, 1, 2, 2, 3]


def test_pinned_copies_give_the_same_chunks_on_both_rings():
    outs = []
    for kind in ("native", "python"):
        c1 = PinnedCopy([3, 1], 4)
        ring, slow = make(kind, 5, 8)
        slow.copy_to_host = lambda tensor, c1=c1: c1  # type: ignore[method-assign]
        ring.copy_type = PinnedCopy
        with ring.begin(2) as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept(FakeCuda([0, 0]))
        held, bound = ring.pending(8)
        out = _ring.Drained._make(ring.drain(bound, 8, [0], -1, True))
        outs.append((normalise([(h[0], h[2] is c1) for h in held]), bound,
                     normalise(out._replace(released=[r is c1 for r in out.released]))))
    assert outs[0] == outs[1]


@pytest.mark.parametrize("kind", ["native", "python"])
def test_a_finalizer_run_by_the_drain_cannot_move_the_ring_under_it(kind):
    """Dropping a caller's object can run Python code (a ``__del__``), which can hand the GIL to
    another thread mid-walk -- the worker, beginning a cycle on a full ring, drops the oldest
    slot: the very one being walked. Here the finalizer begins that cycle itself, on the
    drain's own thread: the drain must finish its walk first (every cycle counted once, none
    skipped) and the finalizer's cycle wait for the next drain."""
    ring, slow = make(kind, 0, 4)
    ran: list[int] = []

    class BeginsACycle:
        def __del__(self) -> None:
            ran.append(len(ring))
            with ring.begin() as c:
                c.mark("verify")
                c.mark("bookkeeping")

    c = ring.begin()
    c.accept(BeginsACycle())  # kept as the object: the slot holds the only reference
    c.end()  # before its phases: discarded, the slot void with the object still in it
    del c
    for _ in range(3):
        with ring.begin() as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept([1, 2], draft_length=4)
    assert len(ring) == 3 and ring.dropped_queue_full == 0
    n = ring.drain_into(1 << 60, 100, [], -1, False)[0]
    assert ran == [0]  # the finalizer ran after the walk, when nothing was left waiting
    assert n == 3
    assert ring.totals()[0] == 3 and ring.totals()[3] == 9
    assert ring.dropped_queue_full == 0
    assert len(ring) == 1  # the finalizer's cycle, for the next drain
    assert ring.drain_into(1 << 60, 100, [], -1, False)[0] == 1
    assert ring.totals()[0] == 4 and len(ring) == 0


def run_bursts(kind: str, seed: int) -> tuple[list[Any], Any]:
    """Bursts of well-formed cycles (the common case: what the native core drains with the GIL
    let go) mixed with cycles that need Python (kept objects, per-sequence draft lengths, an
    ``emitted``, bad values, sampled events, misuse), drained into the running totals with
    random limits, traced indices and slow thresholds."""
    rng = random.Random(seed)
    ring, slow = make_random(kind, seed, rng, [64, 256], sampled=0.5, intervals=[7, 50])
    log: list[Any] = []
    for _ in range(40):
        for _ in range(rng.randint(0, 120)):
            u = rng.random()
            c = ring.begin(rng.choice([None, 4, 8]))
            c.mark("verify")
            c.mark("bookkeeping")
            if u < 0.7:
                n = rng.choice([1, 4, 8])
                vals = [rng.randint(0, 4) for _ in range(n)]
                form = rng.choice(["list", "tuple", "np64", "array"])
                acc = (vals if form == "list" else tuple(vals) if form == "tuple"
                       else np.array(vals, dtype=np.int64) if form == "np64"
                       else array.array("q", vals))
                c.accept(acc, draft_length=4)
            elif u < 0.95:
                acc, kw = acceptance_input(rng)
                c.accept(acc, **kw)
            if rng.random() < 0.02:
                c.mark("nope")  # misuse: the cycle is discarded
            c.end()
        held, bound = ring.pending(rng.choice([8, 64, 1000]))
        if held and rng.random() < 0.3:
            bound = held[rng.randrange(len(held))][0]
        trace = sorted(rng.sample(range(max(bound, 1)), min(2, max(bound, 1))))
        if rng.random() < 0.5:
            trace = [t for t in trace if t >= bound - 40]
        args = (bound, rng.choice([16, 100, 1000]), trace, rng.choice([-1, -1, 40 * 997]),
                rng.random() < 0.1)
        log.append(("drain_into", normalise(ring.drain_into(*args))))
        log.append(("totals", normalise(ring.totals()), ring.drained, len(ring)))
    log.append(("final", normalise(ring.drain_into(1 << 60, 1 << 30, [], -1, False))))
    log.append(("totals", normalise(ring.totals()), ring.drained, len(ring)))
    log.append(("calls", slow.calls))
    return log, ring


@pytest.mark.parametrize("seed", range(24))
def test_the_common_case_drained_without_the_gil_equals_its_specification(seed):
    """The native core walks the common case with the GIL let go (``drain_into``: no Python
    API in the walk, its own lock against a full ring's begin()): chunk for chunk, total for
    total, the same as the pure-Python ring, which always holds the GIL."""
    native, ring = run_bursts("native", seed)
    python, _ = run_bursts("python", seed)
    assert len(native) == len(python)
    for a, b in zip(native, python, strict=True):
        assert a == b
    # Both paths ran: the walk took cycles, and cycles that need Python went the other way.
    assert 0 < ring.nogil_cycles < ring.drained, (ring.nogil_cycles, ring.drained)
    assert ring.nogil_walks > 0 and ring.nogil_ns > 0


def test_a_walk_stops_at_a_traced_or_slow_cycle_and_leaves_it_for_python():
    ring, _ = make("native", 0, 256)
    for i in range(40):
        with ring.begin(2) as c:
            c.mark("verify")
            if i == 30:
                ring.tick = 997 * 100  # one slow cycle
            c.mark("bookkeeping")
            ring.tick = 997
            c.accept([1, 2], draft_length=4)
    n, _, details, _ = ring.drain_into(1 << 60, 1000, [20], 50 * 997, False)
    assert n == 40
    assert [(d.cycle_index, d.traced) for d in details] == [(20, 1), (30, 1)]  # traced, slow
    # The walk took 0..19, Python the traced 20, the walk 21..29 (19 waited, enough for a
    # walk), Python the slow 30 and the 9 after it (too few to let go of the GIL for).
    assert ring.nogil_cycles == 29
    assert ring.nogil_walks == 2
    totals = ring.totals()
    assert totals[0] == 40 and totals[3] == 40 * 3  # every cycle counted, once


def test_the_native_ring_has_its_specifications_names_and_only_the_stubs_own_besides():
    # specobs/_core.pyi types the native Ring as PyRing's names plus the few it declares
    # itself; a public name on neither is one that stub and specification both lack.
    if not _ring.BUILT:
        pytest.skip("the native core is not built")
    native, _ = make("native", 0, 4)
    python, _ = make("python", 0, 4)

    def public(obj: Any) -> set[str]:
        return {name for name in dir(obj) if not name.startswith("_")}

    stub = ast.parse((Path(_ring.__file__).parent / "_core.pyi").read_text())
    ring = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "Ring")
    declared = {n.name for n in ring.body if isinstance(n, ast.FunctionDef)}
    declared |= {n.target.id for n in ring.body
                 if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert public(native) - public(python) == declared - {"__init__", "__len__", "__getattr__"}
    assert public(native.begin(None)) == public(python.begin(None))
