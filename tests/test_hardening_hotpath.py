"""The hot path and acceptance under misuse: what a bad call costs, and that it is counted once.

* A misuse message shows the caller's value through a bounded ``short_repr``, and is built only
  when the rate-limited log emits it: a suppressed line never calls the value's ``repr``.
* A bool is not an accepted length, whatever else shares the resolver's chunk, on the compiled
  and on the pure-Python bucketing.
* An observer is one thread's. Shared by several threads, it still counts every begun cycle
  exactly once: resolved, or discarded as misuse when another thread's ``begin()`` closed it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

import pytest

import specobs
from specobs import _bucketing, _recorder
from specobs._recorder import short_repr


def _observer(**kw):
    # A poll interval no test reaches: only force_flush() resolves, so a chunk is what we say.
    return specobs.configure(sinks=[], poll_interval_seconds=3600, **kw)


def _lines(caplog, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


class CountingRepr:
    """A value whose repr is expensive in a way we can count."""

    calls = 0

    def __repr__(self) -> str:
        CountingRepr.calls += 1
        return "<counting " + "z" * 10_000 + ">"


@pytest.fixture
def counting():
    CountingRepr.calls = 0
    return CountingRepr()


# -- misuse messages: built only when emitted, and bounded -----------------------------------


def test_a_suppressed_misuse_line_never_calls_the_values_repr(caplog, counting):
    caplog.set_level(logging.WARNING, logger="specobs")
    obs = _observer()
    c = obs.begin()
    for _ in range(500):
        c.mark(counting)  # unknown phase, on an open cycle
    c.mark("verify")
    for _ in range(500):
        c.mark(counting)  # still unknown (a cycle's unknown_phase keeps its times)
    c.mark("bookkeeping")
    c.end()
    for _ in range(500):
        c.mark(counting)  # the handle of an ended cycle
        obs.mark(counting)  # the observer with no open cycle
        obs.set_requests(running=counting)  # not a count
    assert obs.force_flush()
    s = obs.snapshot()
    obs.shutdown()

    assert s.errors["unknown_phase"] == 1000
    assert s.errors["mark_without_begin"] == 1000
    assert s.errors["bad_request_counts"] == 500
    assert s.cycles_total == 1
    emitted = _lines(caplog, "<counting")
    # One line per kind (rate-limited), and the repr called for those lines only.
    assert len(emitted) == 3
    assert CountingRepr.calls == len(emitted)
    assert all(len(line) < 300 for line in emitted)  # the 10,000-character repr is cut


HUGE = {
    "str": lambda: "x" * 10**7,
    "list": lambda: list(range(10**6)),
    "tuple": lambda: tuple(range(10**6)),
    "set": lambda: set(range(10**5)),
    "dict": lambda: {i: "v" * 1000 for i in range(10**4)},
    "bytes": lambda: b"y" * 10**7,
    "int": lambda: 10**100_000,  # its full repr is refused (int_max_str_digits), and quadratic
    "str-subclass": lambda: type("Str", (str,), {})("s" * 10**6),
    "list-subclass": lambda: type("List", (list,), {})(range(10**5)),
}


@pytest.mark.parametrize("make", HUGE.values(), ids=HUGE.keys())
def test_a_huge_bad_value_gives_a_short_message(caplog, make):
    caplog.set_level(logging.WARNING, logger="specobs")
    obs = _observer()
    c = obs.begin()
    c.mark(make())
    c.end()
    assert obs.force_flush()
    errors = obs.snapshot().errors
    obs.shutdown()
    assert errors["unknown_phase"] == 1
    assert errors["internal"] == 0
    (line,) = _lines(caplog, "unknown phase")
    assert len(line) < 200


def test_a_huge_container_of_slow_values_reprs_only_what_it_shows(counting):
    text = short_repr([CountingRepr() for _ in range(10_000)])
    assert 1 <= CountingRepr.calls <= 6  # the few items shown, not the 10,000
    assert len(text) <= 80 and text.startswith("[") and text.endswith("...")
    CountingRepr.calls = 0
    short_repr({i: CountingRepr() for i in range(10_000)})
    assert 1 <= CountingRepr.calls <= 4


def test_short_repr_is_bounded_and_never_raises():
    class Raises:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert short_repr(Raises()) == "<Raises>"
    assert short_repr([Raises()]).startswith("[<Raises")
    assert short_repr("verify") == "'verify'"
    assert short_repr((1,)) == "(1,)"
    assert short_repr(True) == "True"
    for value in ("x" * 1000, list(range(1000)), {"k": ["v" * 500] * 50}, 2**5000, Raises()):
        assert len(short_repr(value)) <= 80
        assert len(short_repr(value, 30)) <= 30


# -- acceptance: bools are not counts, whatever shares the chunk -----------------------------


def _bool_values():
    values = [("list", [True, True]), ("tuple", (True, False))]
    try:
        import numpy as np

        values.append(("numpy", np.array([True, True])))
    except ImportError:
        pass
    try:
        import torch

        values.append(("torch", torch.tensor([True, True])))
    except ImportError:
        pass
    return values


BOOLS = _bool_values()


def _neighbours():
    """(name, acceptance, draft_length, accepted if valid else None)."""
    out = [
        ("alone", None, None, None),
        ("ints", [1, 2], None, 3),
        ("floats", [1.0, 2.0], None, 3),
        ("ints-other-draft-length", [1, 2], 3, 3),
        ("bad-cycle", ["x"], None, None),
        ("bool-list", [True, False], None, None),
    ]
    try:
        import numpy as np

        out.append(("numpy-ints", np.array([2, 1]), None, 3))
        out.append(("numpy-bools", np.array([True, True]), None, None))
    except ImportError:
        pass
    try:
        import torch

        out.append(("torch-ints", torch.tensor([2, 1]), None, 3))
        out.append(("torch-bools", torch.tensor([False, True]), None, None))
    except ImportError:
        pass
    return out


NEIGHBOURS = _neighbours()


def _resolve(cycles):
    """Each (acceptance, draft_length) as one cycle, all resolved in one chunk."""
    obs = _observer()
    for acc, k in cycles:
        c = obs.begin()
        c.mark("verify")
        c.mark("bookkeeping")
        if acc is not None:
            c.accept(acc, draft_length=k)
        c.end()
    assert obs.force_flush()
    s = obs.snapshot()
    obs.shutdown()
    return s


@pytest.fixture(params=["compiled", "reference"])
def bucketing(request, monkeypatch):
    if request.param == "compiled":
        if not _bucketing.COMPILED:
            pytest.skip("specobs._speedups not built")
    else:
        monkeypatch.setattr(_bucketing, "count_lengths", _bucketing.count_lengths_py)
    return request.param


@pytest.mark.parametrize("bools", [v for _, v in BOOLS], ids=[n for n, _ in BOOLS])
@pytest.mark.parametrize(
    ("acc", "k", "accepted"), [n[1:] for n in NEIGHBOURS], ids=[n[0] for n in NEIGHBOURS]
)
@pytest.mark.parametrize("first", [True, False], ids=["bools-first", "bools-last"])
def test_bool_acceptance_is_refused_whatever_shares_the_chunk(bucketing, bools, acc, k,
                                                             accepted, first):
    cycles = [(bools, None)]
    neighbour_bad = 0
    if acc is not None:
        cycles.insert(len(cycles) if first else 0, (acc, k))
        neighbour_bad = 1 if accepted is None else 0
    s = _resolve(cycles)
    assert s.cycles_total == len(cycles)  # a bad acceptance costs only the acceptance
    assert s.errors["bad_acceptance"] == 1 + neighbour_bad
    assert s.accepted_tokens_total == (accepted or 0)
    assert sum(s.accept_length.counts) == (2 if accepted is not None else 0)


def test_count_lengths_refuses_bools_on_both_implementations():
    implementations = [_bucketing.count_lengths_py]
    if _bucketing.COMPILED:
        implementations.append(_bucketing.count_lengths)
    for f in implementations:
        assert f([[0, 1, 1]], 4, 5) == [1, 2, 0, 0, 0]
        for lists in ([[True]], [[0, 1], [False]], [[1], [2, 3, True]]):
            with pytest.raises(TypeError):
                f(lists, 4, 5)


# -- threads: an observer is one thread's; shared, it counts each begun cycle once -----------


def test_a_begin_from_another_thread_discards_that_cycle_once():
    """The documented behaviour when one observer is shared: a begin() closes the open cycle,
    whichever thread has it; that thread's end() then counts as misuse and enqueues nothing."""
    obs = _observer()
    marked = threading.Event()
    may_end = threading.Event()

    def owner():
        c = obs.begin()
        c.mark("verify")
        c.mark("bookkeeping")
        marked.set()
        may_end.wait()
        c.end()

    t = threading.Thread(target=owner)
    t.start()
    try:
        assert marked.wait(60)
        other = obs.begin()  # this thread, while the owner's cycle is open
        other.mark("verify")
        other.mark("bookkeeping")
        other.end()
    finally:
        may_end.set()
        t.join(60)
    assert obs.force_flush()
    s = obs.snapshot()
    obs.shutdown()
    assert s.errors["begin_while_open"] == 1
    assert s.errors["end_without_begin"] == 1  # the owner's end(), after its cycle was closed
    assert s.dropped.get("misuse", 0) == 1
    assert s.cycles_total == 1


THREADS = 8
CYCLES = 4000


class YieldingHandler(logging.Handler):
    """A log handler doing I/O: it releases the GIL in the middle of every misuse call."""

    def emit(self, record: logging.LogRecord) -> None:
        time.sleep(0)


@pytest.mark.parametrize("every_line", [False, True], ids=["rate-limited", "every-line-logged"])
def test_threads_sharing_one_observer_count_every_begun_cycle_exactly_once(
    fast_switching, monkeypatch, every_line
):
    assert sys.getswitchinterval() < 1e-5  # threads switch mid-cycle, constantly
    if every_line:
        # Widen the window: each begin_while_open line goes through a handler that lets the
        # other threads run, as if it wrote to a file, while the begin is under way.
        monkeypatch.setattr(_recorder, "_LOG_EVERY_NS", 0)
        handler = YieldingHandler()
        logging.getLogger("specobs").addHandler(handler)
    obs = _observer(queue_size=THREADS * CYCLES)  # nothing dropped for a full queue
    barrier = threading.Barrier(THREADS)
    failures: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            barrier.wait(60)
            for i in range(CYCLES):
                c = obs.begin(4)
                c.mark("verify")
                if (i + seed) % 5 == 0:
                    c.end()  # before bookkeeping: misuse, discarded
                    continue
                c.mark("bookkeeping")
                c.accept([1, 2, 0, 3], draft_length=4)
                c.end()
        except BaseException as exc:  # the hot path never raises; a failure here is a bug
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        if every_line:
            logging.getLogger("specobs").removeHandler(handler)
    assert not any(t.is_alive() for t in threads)
    assert obs.force_flush(60)
    s = obs.snapshot()
    obs.shutdown()
    assert failures == []

    begun = THREADS * CYCLES
    assert s.dropped.get("queue_full", 0) == 0
    assert s.errors["internal"] == 0
    # Each begun cycle is counted once: resolved, or discarded as misuse -- never both.
    assert s.cycles_total + s.dropped.get("misuse", 0) == begun
    assert s.dropped.get("misuse", 0) >= begun // 5  # the early ends, at least
    # Only whole cycles were enqueued (an early end or a cycle another begin closed never is).
    assert s.accepted_tokens_total == 6 * s.cycles_total


# -- what one cycle may carry (third hostile review, case 17) ------------------------------------

def _ended(obs, batch=None):
    c = obs.begin(batch)
    c.mark("verify")
    c.mark("bookkeeping")
    return c


def _traced_while(record):
    """``record()`` run under tracemalloc: the bytes still allocated after it (what the queue
    holds, as nothing is drained meanwhile) and the peak during it."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        record()
        gc.collect()
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return now - base, peak - base


@pytest.mark.parametrize("form", ["list", "ndarray"])
def test_a_cycle_carrying_more_sequences_than_the_bound_is_refused_and_counted(
        core, form, caplog):
    """Fresh 10**5-long acceptance every cycle: the queue kept a copy of each (1.65 GB at full
    rate, where the resolver lagged). Past ``max_cycle_sequences`` (16,384 by default) a
    cycle's acceptance is refused before anything is copied: the cycle keeps its times and
    batch size, counted as ``dropped_records{reason="oversized"}``, said once. Nothing drains
    here (300 cycles stay under the wake-up), so what the queue keeps is all it would hold."""
    import numpy as np

    n = 300
    obs = _observer(clock="host")
    try:
        def record():
            for i in range(n):
                c = _ended(obs, 4)
                big = [i % 3] * 10**5 if form == "list" else np.full(10**5, i % 3)
                c.accept(big, draft_length=4)
                c.end()

        with caplog.at_level(logging.WARNING, logger="specobs"):
            kept, peak = _traced_while(record)
        assert kept < 2 << 20, kept  # a copy per cycle was 800 KB: 240 MB for these
        assert peak < 8 << 20, peak  # the caller's own list, one at a time
        assert obs.force_flush(5)
        s = obs.snapshot()
    finally:
        obs.shutdown()
    assert (s.cycles_total, s.accepted_tokens_total, s.draft_tokens_total) == (n, 0, 0)
    assert s.batch_size.count == n and s.phase_histograms[("verify", "host")].count == n
    assert {k: v for k, v in s.dropped.items() if v} == {"oversized": n}
    lines = _lines(caplog, "max_cycle_sequences")
    assert len(lines) == 1, lines
    assert "100000 values in one list: more than max_cycle_sequences=16384" in lines[0]
    assert "SPECOBS_MAX_CYCLE_SEQUENCES" in lines[0] and 'reason="oversized"' in lines[0]


def test_what_waiting_cycles_keep_is_bounded_in_bytes(core, caplog):
    """Cycles within the per-cycle bound whose acceptance the resolver must validate in Python
    (here: ``emitted`` given, as vLLM's instrumentor gives it) keep their lists in the queue. The
    ring estimates what they hold and refuses a cycle whose acceptance would take the queue
    past ``max_queue_bytes``; measured with tracemalloc, what the queue keeps stays within it,
    while the resolver (never woken below 1,024 waiting cycles) drains nothing."""
    limit = 4 << 20
    n, seqs = 200, 16384
    per_cycle = 2 * (56 + 8 * seqs)  # the copied acceptance and the emitted counts kept
    fits = limit // per_cycle
    obs = _observer(clock="host", max_queue_bytes=limit)
    ring = obs._recorder.ring
    seen = []
    try:
        def record():
            for _ in range(n):
                c = _ended(obs, seqs)
                c.accept([1] * seqs, draft_length=2, emitted=[2] * seqs)
                c.end()
                seen.append(ring.queued_bytes)

        with caplog.at_level(logging.WARNING, logger="specobs"):
            kept, _ = _traced_while(record)
        assert max(seen) == fits * per_cycle <= limit
        assert kept < limit + (1 << 20), kept  # before: 200 cycles, 52 MB
        assert obs.force_flush(10)
        assert ring.queued_bytes == 0  # drained: the resolver holds them now, then lets go
        s = obs.snapshot()
    finally:
        obs.shutdown()
    assert s.cycles_total == n and s.accepted_tokens_total == fits * seqs
    assert s.emitted_tokens_total == fits * 2 * seqs
    assert {k: v for k, v in s.dropped.items() if v} == {"oversized": n - fits}
    lines = _lines(caplog, "max_queue_bytes")
    assert len(lines) == 1, lines
    assert f"more than max_queue_bytes={limit} (SPECOBS_MAX_QUEUE_BYTES" in lines[0]


@pytest.mark.parametrize(("setting", "bad"), [("SPECOBS_MAX_CYCLE_SEQUENCES", "0"),
                                              ("SPECOBS_MAX_CYCLE_SEQUENCES", "65537"),
                                              ("SPECOBS_MAX_QUEUE_BYTES", "1k")])
def test_the_payload_bounds_are_validated_settings(setting, bad):
    with pytest.raises(specobs.ConfigurationError, match=setting):
        specobs.configure(sinks=[], clock="host", env={setting: bad})
