"""Cycle handles and ring slots: a handle is reused only when nobody else holds it, a kept
handle never writes into a later cycle, and counts, times and resolved cycles stay exact
whatever the mix of acceptance inputs -- on both implementations of the ring (the native one
and its pure-Python specification, specobs/_ring.py).
"""

from __future__ import annotations

import gc
import inspect

import pytest

import specobs
from specobs import _ring
from specobs._recorder import NULL_CYCLE
from specobs.instrument._base import PhaseTracker
from specobs.timing import FakeDeviceArray, FakeEventClock, FakeGpu

CORES = ["native", "python"] if _ring.BUILT else ["python"]


@pytest.fixture(params=CORES, autouse=True)
def core(request, monkeypatch):
    """Every test here runs on each ring implementation."""
    monkeypatch.setattr(_ring, "NATIVE", request.param == "native")
    return request.param


def make(*, gpu=None, max_cycles=100_000, **kwargs):
    gpu = gpu or FakeGpu()
    mem = specobs.MemorySink(max_cycles=max_cycles)
    kwargs.setdefault("sample_every", 1)
    obs = specobs.configure(
        sinks=[mem], clock=FakeEventClock(gpu, pool_size=4096), poll_interval_seconds=3600,
        **kwargs,
    )
    return obs, mem, gpu


def one(obs, gpu, i, accepted=None, **accept_kwargs):
    """One cycle of GPU work 100 + i / 300 + i / 50 + i ns; returns nothing (holds nothing)."""
    c = obs.begin()
    gpu.run(100 + i)
    c.mark("verify")
    gpu.run(300 + i)
    c.mark("bookkeeping")
    gpu.run(50 + i)
    if accepted is not None:
        c.accept(accepted, **accept_kwargs)
    c.end()


def test_a_handle_kept_after_end_is_never_reused_and_stays_closed():
    obs, mem, gpu = make()
    with obs.cycle() as kept:  # the context-manager form leaves the handle bound afterwards
        gpu.run(100)
        kept.mark("verify")
        gpu.run(300)
        kept.mark("bookkeeping")
        gpu.run(50)
        kept.accept([3, 1], draft_length=4)
    gpu.complete()
    assert obs.force_flush()
    seen = set()
    for _round in range(20):
        for i in range(50):
            c = obs.begin()
            assert c is not kept
            seen.add(id(c))
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept([i % 5], draft_length=4)
            c.end()
            del c
        gpu.complete()
        assert obs.force_flush()
    assert len(seen) <= 4  # handles were reused...
    assert kept.index == 0 and kept._closed  # ...but never this one
    errors0 = dict(obs.snapshot().errors)
    kept.mark("verify")
    kept.accept([4], draft_length=4)
    kept.end()
    assert obs.force_flush()
    s = obs.snapshot()
    assert s.cycles_total == 1001
    assert s.accepted_tokens_total == 4 + sum(i % 5 for i in range(50)) * 20
    assert sum(s.errors.values()) == sum(errors0.values()) + 3  # all three stale calls counted
    assert next(c.gpu_ns for c in mem.cycles) == [100, 300, 50]
    obs.shutdown()


def test_handles_held_by_a_caller_are_never_handed_out_again():
    obs, mem, gpu = make()
    held = []
    for i in range(100):
        c = obs.begin()
        c.mark("verify")
        c.mark("bookkeeping")
        c.end()
        if i % 10 == 0:
            held.append(c)
        del c
    gpu.complete()
    assert obs.force_flush()
    ids = {id(h) for h in held}
    indices = [h.index for h in held]
    for _ in range(300):
        c = obs.begin()
        assert not any(c is h for h in held)
        c.mark("verify")
        c.mark("bookkeeping")
        c.end()
        del c
    gpu.complete()
    assert obs.force_flush()
    assert [h.index for h in held] == indices and {id(h) for h in held} == ids
    assert all(h._closed for h in held)
    assert obs.snapshot().cycles_total == 400
    obs.shutdown()


def test_an_instrumentor_tracker_never_writes_into_a_reused_record():
    obs, mem, gpu = make()
    tracker = PhaseTracker(obs)
    for i in range(200):
        tracker.start(batch_size=2)
        gpu.run(100)
        tracker.enter("verify")
        gpu.run(300)
        tracker.accept([i % 5, 1], 4)
        tracker.enter("bookkeeping")
        gpu.run(50)
        if i % 50 == 49:
            tracker.finish()
            gpu.complete()
            assert obs.force_flush()
    tracker.finish()
    gpu.complete()
    assert obs.force_flush()
    s = obs.snapshot()
    assert s.cycles_total == 200
    assert s.accepted_tokens_total == sum(i % 5 + 1 for i in range(200))
    assert [c.gpu_ns for c in mem.cycles] == [[100, 300, 50]] * 200
    assert sum(s.errors.values()) == 0
    obs.shutdown()


def test_counts_times_and_resolved_cycles_stay_exact_through_reuse():
    # Each flush resolves a chunk whose records are reused by the next chunk, through every
    # acceptance path: lists, tuples, numpy arrays, CUDA copies, per-sequence draft lengths
    # (the per-cycle validation, which writes _resolved_acc), bad values and no acceptance.
    np = pytest.importorskip("numpy")
    obs, mem, gpu = make()
    expected_acc = []
    expected_gpu = []
    expected_errors = 0
    for chunk in range(12):
        for i in range(40):
            kind = (chunk + i) % 6
            n = chunk * 40 + i
            if kind == 0:
                acc, kw, want = [i % 5, 1], {"draft_length": 4}, [i % 5, 1]
            elif kind == 1:
                acc, kw, want = (2, i % 3), {"draft_length": 4}, [2, i % 3]
            elif kind == 2:
                acc, kw, want = np.array([i % 4]), {"draft_length": 4}, [i % 4]
            elif kind == 3:
                acc, kw, want = [1, 2, 0], {"draft_length": [1, 2, 3]}, [1, 2, 0]
            elif kind == 4:
                acc, kw, want = FakeDeviceArray([3, i % 2]), {"draft_length": 4}, [3, i % 2]
            else:
                acc, kw, want = ([9], {"draft_length": 4}, None) if i % 2 else (None, {}, None)
                expected_errors += i % 2
            one(obs, gpu, n, acc, **kw)
            expected_acc.append(want)
            expected_gpu.append([100 + n, 300 + n, 50 + n])
        gpu.complete()
        assert obs.force_flush()
    s = obs.snapshot()
    cycles = list(mem.cycles)
    assert len(cycles) == 480 == s.cycles_total
    assert [c.index for c in cycles] == list(range(480))
    assert [c.gpu_ns for c in cycles] == expected_gpu
    assert [c.accept_lengths for c in cycles] == expected_acc
    assert s.accepted_tokens_total == sum(sum(a) for a in expected_acc if a)
    assert s.errors.get("bad_acceptance", 0) == expected_errors
    obs.shutdown()


def test_a_reused_record_carries_nothing_from_its_previous_cycle():
    # The first chunk takes the per-cycle validation (per-sequence draft lengths), which leaves
    # the validated acceptance on each record; the second takes the column path, which reads
    # it if present. A reused record must not show its previous cycle's acceptance.
    obs, mem, gpu = make()
    for i in range(30):
        one(obs, gpu, i, [1, 1], draft_length=[2, 2])
    gpu.complete()
    assert obs.force_flush()
    for i in range(30):
        one(obs, gpu, i, [i % 4], draft_length=4)
    for i in range(30):
        one(obs, gpu, i)  # no acceptance at all
    gpu.complete()
    assert obs.force_flush()
    cycles = list(mem.cycles)
    assert [c.accept_lengths for c in cycles[30:60]] == [[i % 4] for i in range(30)]
    assert [c.drafted for c in cycles[30:60]] == [4] * 30
    assert [c.accept_lengths for c in cycles[60:]] == [None] * 30
    s = obs.snapshot()
    assert s.accepted_tokens_total == 60 + sum(i % 4 for i in range(30))
    assert s.draft_tokens_total == 120 + 120
    obs.shutdown()


def test_a_resolved_cycle_keeps_its_acceptance_after_its_record_is_reused():
    obs, mem, gpu = make()
    acc = [1, 2, 3]
    one(obs, gpu, 0, acc, draft_length=4)
    gpu.complete()
    assert obs.force_flush()
    first = mem.cycles[0]
    for i in range(20):
        one(obs, gpu, i, [0, 0, 0], draft_length=4)
    acc[:] = [4, 4, 4]  # the caller reuses its own list too
    gpu.complete()
    assert obs.force_flush()
    assert first.accept_lengths == [1, 2, 3]
    obs.shutdown()


def test_a_steady_loop_allocates_no_tracked_object_per_cycle():
    # Records wait up to a poll interval; allocated per cycle, they survive young collections
    # and drive full ones (tens of ms with a server's heap). Reused, the loop triggers none.
    obs = specobs.configure(
        clock="host", sinks=[specobs.MemorySink(max_cycles=0)], poll_interval_seconds=3600
    )
    acc = [1, 0, 2, 3, 0, 1, 4, 2]

    def rounds(n):
        for _ in range(n):
            for _ in range(500):
                c = obs.begin()
                c.mark("verify")
                c.mark("bookkeeping")
                c.accept(acc, draft_length=4)
                c.end()
            del c
            obs.force_flush()

    rounds(2)  # warm: every slot used once
    collections = []

    def probe(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    gc.collect()
    gc.callbacks.append(probe)
    try:
        rounds(40)  # 20,000 cycles: 3 allocations each would be ~85 young collections
    finally:
        gc.callbacks.remove(probe)
    assert obs.snapshot().cycles_total == 21_000
    assert len(collections) <= 4, collections
    obs.shutdown()


def test_a_sequence_that_drafted_nothing_has_no_accept_length():
    """vLLM's num_drafts counts the requests that drafted: a row with draft length 0 (a
    request in prefill, an n-gram with no match) emits its token but is no draft, on every
    path -- per-sequence draft lengths, a whole cycle at k = 0, and the native ring."""
    obs = specobs.configure(clock="host", sinks=[], max_draft_length=4,
                            poll_interval_seconds=3600)
    for acc, kw in [
        ([2, 0, 1], {"draft_length": [3, 0, 4]}),  # the middle row drafted nothing
        ([0, 0], {"draft_length": 0}),  # nothing drafted at all
        ([1, 4], {"draft_length": 4}),
    ]:
        with obs.cycle() as c:
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept(acc, **kw)
    assert obs.force_flush()
    s = obs.snapshot()
    assert s.accept_length.count == 2 + 2  # drafts: rows 1 and 3 of the first cycle, the last two
    assert s.accept_length.sum == 3 + 5
    assert s.accepted_tokens_total == 8
    assert s.draft_tokens_total == 7 + 0 + 8
    assert s.emitted_tokens_total == (3 + 3) + (0 + 2) + (5 + 2)
    assert s.drafted_by_position == (2 + 2, 2 + 2, 2 + 2, 1 + 2)
    obs.shutdown()


def _parameters(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_every_handle_states_accept_and_settle_as_the_protocol_does():
    # specobs/_model.py's CycleHandle is the one statement of what accept() and settle() take;
    # each implementation restates it (the native cycle's is checked by calls below).
    from specobs._model import CycleHandle
    from specobs._observer import Observer
    from specobs._recorder import _NullCycle

    want = _parameters(CycleHandle.accept)
    assert [p[0] for p in want] == ["self", "accepted", "draft_length", "batch_size", "emitted"]
    for fn in (CycleHandle.settle, Observer.accept, _ring.PyCycle.accept, _ring.PyCycle.settle,
               _NullCycle.accept, _NullCycle.settle):
        assert _parameters(fn) == want, fn.__qualname__
    # The native cycle's help() states the same (its self is positional-only, as C's is).
    native = [getattr(_ring._NativeCycle, m) for m in ("accept", "settle")] if _ring.BUILT else []
    for fn in native:
        assert _parameters(fn)[1:] == want[1:], fn
    # mark() takes its phase by position only: the native cycle's is a one-argument C call.
    want = _parameters(CycleHandle.mark)
    assert want[1][:2] == ("phase", inspect.Parameter.POSITIONAL_ONLY)
    natives = [_ring._NativeCycle.mark] if _ring.BUILT else []
    for fn in (_ring.PyCycle.mark, _NullCycle.mark, *natives):
        assert _parameters(fn)[1:] == want[1:], fn


def test_accept_and_settle_take_accepted_by_name_and_refuse_a_wrong_call_before_anything(core):
    obs, mem, gpu = make()

    def cycle():
        c = obs.begin()
        gpu.run(100)
        c.mark("verify")
        gpu.run(300)
        c.mark("bookkeeping")
        gpu.run(50)
        return c

    c = cycle()
    c.accept(accepted=[2, 1], draft_length=3, batch_size=2)
    c.end()

    c = cycle()
    for bad, words in [
        (lambda h: h.accept(), "accepted"),
        (lambda h: h.accept([1], [2]), "positional"),
        (lambda h: h.accept([1], accepted=[1]), "multiple values"),
        (lambda h: h.accept([1], draft=3), "draft"),
        (lambda h: h.settle(), "accepted"),
        (lambda h: h.settle([1], [2]), "positional"),
    ]:
        with pytest.raises(TypeError, match=words) as raised:
            bad(c)
        # Worded as Python words the protocol's own method, whichever ring raised it.
        with pytest.raises(TypeError) as protocol:
            bad(NULL_CYCLE)
        assert str(raised.value) == str(protocol.value).replace(
            "CycleHandle.", f"{type(c).__name__}.")
    c.accept([1], draft_length=3)
    with pytest.raises(TypeError):
        c.mark(phase="verify")
    c.end()

    handle = cycle().defer()
    with pytest.raises(TypeError, match=r"settle\(\) got an unexpected keyword argument 'bogus'"):
        handle.settle([9], bogus=1)
    with pytest.raises(TypeError, match="settle"):
        handle.settle(None, draft_length=3, extra=1)
    handle.settle(accepted=[3], draft_length=3)  # still awaiting: the refused calls changed nothing

    gpu.complete()
    assert obs.force_flush()
    s = obs.snapshot()
    assert [c.accept_lengths for c in mem.cycles] == [[2, 1], [1], [3]]
    assert s.accepted_tokens_total == 7
    assert s.draft_tokens_total == 12
    assert not any(s.errors.values()), s.errors
    obs.shutdown()

    # After shutdown the handle is the no-op one: it takes the same arguments and refuses alike.
    null = obs.begin()
    null.accept(accepted=[1], draft_length=2, batch_size=1, emitted=[2])
    null.defer().settle(accepted=None)
    with pytest.raises(TypeError):
        null.accept([1], bogus=1)


def test_the_observers_accept_and_end_are_the_current_cycles_and_bind_as_the_protocol(core):
    # Observer.accept and Observer.end are made from the protocol's methods: a wrong call raises
    # whether a cycle is open or not, before anything is counted; a right one with no cycle open
    # is counted as misuse; help() shows the protocol's arguments and their meaning.
    from specobs._model import CycleHandle

    obs, mem, gpu = make()
    with pytest.raises(TypeError, match="draft"):
        obs.accept([1], draft=3)
    with pytest.raises(TypeError):
        obs.end(1)
    obs.accept([1])
    obs.end()
    c = obs.begin()
    gpu.run(100)
    with pytest.raises(TypeError, match="positional"):
        obs.accept([1], [2])
    obs.mark("verify")
    gpu.run(300)
    obs.mark("bookkeeping")
    obs.accept(accepted=[2, 0], draft_length=3, batch_size=2, emitted=[3, 1])
    obs.end()
    assert obs.current is None and c is not None
    gpu.complete()
    assert obs.force_flush()
    s = obs.snapshot()
    assert (s.cycles_total, s.accepted_tokens_total, s.draft_tokens_total,
            s.emitted_tokens_total) == (1, 2, 6, 4)
    assert s.errors["bad_acceptance"] == 1 and s.errors["end_without_begin"] == 1
    assert sum(s.errors.values()) == 2, s.errors
    assert [cy.accept_lengths for cy in mem.cycles] == [[2, 0]]
    obs.shutdown()

    assert "draft_length" in specobs.Observer.accept.__doc__
    assert CycleHandle.accept.__doc__ in specobs.Observer.accept.__doc__
    assert specobs.Observer.accept.__qualname__ == "Observer.accept"
    assert specobs.Observer.end.__module__ == "specobs._observer"


def test_a_cycle_the_engine_raised_in_is_dropped_as_an_exception_not_as_misuse(core):
    # Dropped records say why: an exception inside ``with`` is the engine's failure, where
    # misuse is a wrong call into specobs (also counted as an error of its kind).
    obs, mem, gpu = make()
    for _ in range(3):
        with pytest.raises(RuntimeError), obs.cycle() as c:
            gpu.run(100)
            c.mark("verify")
            raise RuntimeError("the engine's step failed")
    c = obs.begin()
    c.end()  # ended at its first phase: misuse
    one(obs, gpu, 0, [1], draft_length=2)
    gpu.complete()
    assert obs.force_flush()
    s = obs.snapshot()
    assert s.cycles_total == 1
    assert {k: v for k, v in s.dropped.items() if v} == {"exception": 3, "misuse": 1}
    assert {k: v for k, v in s.errors.items() if v} == {"wrong_phase_order": 1}
    obs.shutdown()
