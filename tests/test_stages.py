"""The resolver's stages as functions of a chunk, and the states they keep
(specobs/_stages.py): hand-built details, a fake clock and ring, no threads."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from specobs import _stages, sampling
from specobs._model import Acceptance
from specobs._ring import Detail
from specobs._stages import NativeReads, Traces


def detail(i: int = 0, **kw: Any) -> Detail:
    """A cycle the ring handed over: three phases, 10 ns each, unless ``kw`` says otherwise."""
    fields: dict[str, Any] = dict(
        cycle_index=i, stamps=[100, 110, 120, 130], batch=None, events=None, cost_ns=0,
        acceptance=None, draft_length=None, emitted=None, copy=None, native=0, traced=0,
        cycle_k=-1, cycle_k_obj=None)
    fields.update(kw)
    return Detail(**fields)


class Reports:
    """The recorder's reporting calls, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.phases = ("draft", "verify", "bookkeeping")
        self.log = SimpleNamespace(warn=self.report)

    def report(self, kind: str, message: Any) -> None:
        self.calls.append((kind, message() if callable(message) else message))

    misuse = report

    def drop(self, reason: str, message: Any) -> None:
        self.report(reason, message)


class Clock:
    """Events are ints; elapsed is their difference; releases are recorded."""

    def __init__(self, done: set[int] | None = None) -> None:
        self.released: list[Any] = []
        self.done = done or set()

    def elapsed_ns(self, a: Any, b: Any) -> Any:
        return b - a

    def release(self, ev: Any) -> None:
        self.released.append(ev)

    def query(self, ev: Any) -> bool:
        return ev in self.done


# -- trace selection ----------------------------------------------------------------------------
def test_head_sampling_at_rate_one_picks_every_cycle_once_across_chunks():
    t = Traces(True, 1.0, None)
    assert t.pick(5) == [0, 1, 2, 3, 4]
    assert t.pick(5) == []
    assert t.pick(7) == [5, 6] and t.head_next() == 7


def test_head_sampling_draws_one_geometric_gap_per_picked_cycle():
    t = Traces(True, 0.05, None)
    t.rng = random.Random(7)
    mirror = random.Random(7)
    expected, nxt = [], 0
    while nxt < 2_000:
        expected.append(nxt)
        nxt += 1 + sampling.geometric_gap(mirror.random(), 0.05)
    assert t.pick(2_000) == expected
    assert t.next == nxt


@pytest.mark.parametrize(("want", "rate"), [(False, 1.0), (True, 0.0)])
def test_no_head_sampling_picks_nothing_and_tells_the_pump_so(want: bool, rate: float):
    t = Traces(want, rate, 5)
    assert t.pick(100) == [] and t.head_next() == -1


def test_a_forked_child_draws_other_ids_from_where_it_began():
    t = Traces(True, 1.0, None)
    parent = t.rng
    t.pick(10)
    t.reset(begun=40)
    assert t.rng is not parent and t.pick(42) == [40, 41]
    ids = t.ids(3)
    assert len(ids["phase_span_ids"]) == 3
    assert all(x != 0 for x in (ids["trace_id"], ids["span_id"], *ids["phase_span_ids"]))


# -- the ring's own reads ------------------------------------------------------------------------
def test_native_reads_hand_on_what_the_ring_counted_since_the_last_take():
    n = NativeReads()
    assert n.take((9, 9, 9, 5, 100, 9)) == (5, 100)
    assert n.take((0, 0, 0, 5, 100, 0)) == (0, 0)
    assert n.take((0, 0, 0, 8, 130, 0)) == (3, 30)


def test_native_reads_bind_the_ring_to_a_clock_and_unbind_when_it_is_gone():
    calls: list[tuple[Any, ...]] = []
    ring = SimpleNamespace(set_native_events=lambda *a: calls.append(a), park_events=0,
                           cache_handles=lambda handles: calls.append(("cache", handles)))
    clock = SimpleNamespace(native_event_args=lambda: (1, 2, 3), pool_events=256,
                            idle_events=lambda: ["e1", "e2"])
    n = NativeReads()
    n.bind(ring, clock, nphases=3)
    assert calls == [(1, 2, 3), ("cache", ["e1", "e2"])]
    assert n.clock is clock and ring.park_events == 256 // 4 // 4
    n.bind(ring, None, nphases=3)
    assert calls[-1] == () and n.clock is None
    n.bind(SimpleNamespace(), clock, nphases=3)  # the Python ring reads nothing itself
    assert n.clock is None


# -- poll ------------------------------------------------------------------------------------------
def test_on_one_stream_the_ring_finds_the_bound_itself():
    seen: list[tuple[Any, ...]] = []
    ring = SimpleNamespace(poll=lambda *a: seen.append(a) or 12)
    clock = Clock()
    assert _stages.poll(ring, clock, 64) == 12
    assert seen == [(64, clock.query, _stages.IN_FLIGHT_POLLS_BEFORE_QUERY)]


def test_across_streams_every_event_is_asked_in_order():
    held = [(3, [1, 2], None), (5, [3, 4], None), (7, [5, 6], None)]
    ring = SimpleNamespace(pending=lambda limit: (held, 9), fence_every=4)
    clock = Clock(done={2})
    clock.stream_switched = True
    assert _stages.poll(ring, clock, 64) == 5  # the first cycle whose last event is pending
    assert ring.fence_every == 1  # every copy records its event from now on
    clock.done = {2, 4, 6}
    assert _stages.poll(ring, clock, 64) == 9


# -- read -----------------------------------------------------------------------------------------
def test_gpu_times_are_read_by_position_and_a_negative_one_is_refused():
    rec = Reports()
    clock = Clock()
    details = [detail(0, events=[0, 10, 30, 60], cost_ns=7), detail(1),
               detail(2, events=[50, 40, 60, 70], cost_ns=5)]
    gpu, cost, _read_ns = _stages.read_gpu(details, clock, rec)
    assert gpu == {0: [10, 20, 30]}
    assert cost == 12  # what recording both cycles' events cost, used or not
    assert clock.released == [[0, 10, 30, 60], [50, 40, 60, 70]]
    ((reason, message),) = rec.calls
    assert reason == "clock_backwards" and "-10 ns for phase 'draft'" in message


def test_gpu_times_that_are_not_integers_are_reported_not_used():
    rec = Reports()

    class Floats(Clock):
        def elapsed_ns(self, a: Any, b: Any) -> Any:
            return float(b - a)

    gpu, _, _ = _stages.read_gpu([detail(events=[0, 1, 2, 3])], Floats(), rec)
    assert gpu == {}
    assert rec.calls[0][0] == "elapsed" and "integer nanoseconds" in rec.calls[0][1]


# -- validate, and the rows ------------------------------------------------------------------------
def test_what_the_ring_kept_as_objects_is_validated_and_shown_per_detail():
    rec = Reports()
    good = detail(0, acceptance=[1, 2], draft_length=3)
    stored = detail(1, acceptance=[2], draft_length=3, native=1, batch=1)
    bad = detail(2, acceptance=["x"], draft_length=3)
    acceptance, batches, shown = _stages.validate([good, stored, bad], 8, rec.misuse)
    assert acceptance is not None and acceptance.accepted == 3
    assert batches == [2]  # the batch of the cycle validated here, from its sequences
    a = shown(good)
    assert a is not None and (a.accepted, a.drafted, a.emitted) == (3, 6, 5)
    assert shown(stored) is None and shown(bad) is None
    assert [kind for kind, _ in rec.calls] == ["bad_acceptance"]


def test_a_chunk_with_nothing_kept_as_objects_validates_nothing():
    acceptance, batches, shown = _stages.validate([detail(0), detail(1, native=1, batch=2)], 8,
                                                  Reports().misuse)
    assert (acceptance, batches, shown(detail(0))) == (None, [], None)


def test_resolved_cycles_are_the_traced_ones_and_the_slow_ones():
    traces = Traces(True, 0.5, slow_ns=50)
    details = [detail(0, traced=1), detail(1), detail(2),
               detail(3, native=1, acceptance=[1, 0], draft_length=2, traced=1)]
    gpu = {1: [10, 20, 30], 2: [1, 1, 1]}
    out = _stages.resolved_cycles(details, gpu, lambda d: None, phases=("a", "b", "c"),
                                  anchor_ns=1_000, want_all=False, traces=traces)
    assert [c.index for c in out] == [0, 1, 3]  # 1 took 60 ns on the GPU: slow, traced
    first, slow, native = out
    assert (first.start_wall_ns, first.end_wall_ns, first.host_ns) == (1_100, 1_130,
                                                                       [10, 10, 10])
    assert slow.gpu_ns == [10, 20, 30] and slow.trace_id is not None
    assert (native.accepted, native.drafted, native.batch_size) == (1, 4, 2)
    every = _stages.resolved_cycles(details, gpu, lambda d: None, phases=("a", "b", "c"),
                                    anchor_ns=0, want_all=True, traces=Traces(False, 0.0, None))
    # Every cycle handed on; only those the ring picked carry trace ids.
    assert [c.trace_id is not None for c in every] == [True, False, False, True]


def test_by_draft_length_counts_what_the_ring_could_not_place():
    reports: list[tuple[str, str]] = []
    details = [
        detail(0),  # no draft length: nothing
        detail(1, cycle_k=-2, cycle_k_obj="four"),  # begin's draft length, refused
        detail(2, cycle_k=-2, acceptance=[1, 2], draft_length=3),  # k from accept()
        detail(3, cycle_k=3, native=1, acceptance=[0], draft_length=3, batch=1),
    ]
    validated = {2: Acceptance([1, 2], 3, 6, 5, (3, 2))}
    got = _stages.by_draft_length(details, lambda d: validated.get(d.cycle_index), 8, 3,
                                  lambda kind, msg: reports.append((kind, msg)))
    assert got is not None
    kc, kh, ke, _, kb = got
    # Detail 2 alone: the ring counted detail 3 itself, and its batch size.
    assert kc == {3: 1} and ke == {3: 5} and kb == {3: 2}
    assert kh == {3: [10, 10, 10]}  # its host ns per phase
    assert [kind for kind, _ in reports] == ["bad_draft_length"]
    assert _stages.by_draft_length([detail(0)], lambda d: None, 8, 3, lambda k, m: None) is None


def test_bucketing_falls_back_to_the_reference_when_the_compiled_one_refuses(monkeypatch):
    def refuse(*args: Any) -> Any:
        raise OverflowError("refused")

    expected = _stages._bucketing.bucket_py([1, 5, 9], [2.0, 6.0], 1.0)
    monkeypatch.setattr(_stages._bucketing, "bucket", refuse)
    assert _stages.bucket([1, 5, 9], [2.0, 6.0], 1.0) == expected
