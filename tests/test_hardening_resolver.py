"""Poisoned values cost exactly their own cycle's value, counted; flushes never
wedge. Driven through the public API with a MemorySink and the host clock."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch

import specobs

GOOD, K = [1, 2], 4


def observer():
    mem = specobs.MemorySink()
    obs = specobs.configure(sinks=[mem], clock="host", max_draft_length=K,
                            poll_interval_seconds=3600)
    return obs, mem


def cycle(obs, accepted, **kwargs):
    c = obs.begin()
    c.mark("verify")
    c.mark("bookkeeping")
    c.accept(accepted, **kwargs)
    c.end()


# (accept() arguments of the poisoned cycle, error kind, whether its acceptance counts,
#  its batch size in the histogram or None)
POISON = [
    ({"accepted": [float("inf")]}, "bad_acceptance", False, None),
    ({"accepted": [float("nan"), 1]}, "bad_acceptance", False, None),
    ({"accepted": [1, None]}, "bad_acceptance", False, None),
    ({"accepted": [1, "a"]}, "bad_acceptance", False, None),
    ({"accepted": [1, 2.5, 2]}, "bad_acceptance", False, None),
    ({"accepted": {1: 2}}, "bad_acceptance", False, None),
    ({"accepted": {1, 2}}, "bad_acceptance", False, None),
    ({"accepted": iter([1, 2])}, "bad_acceptance", False, None),
    ({"accepted": "12"}, "bad_acceptance", False, None),
    ({"accepted": [10**30]}, "bad_acceptance", False, None),
    ({"accepted": [-1, 2]}, "bad_acceptance", False, None),
    ({"accepted": [1, 2], "draft_length": float("inf")}, "bad_acceptance", False, None),
    ({"accepted": [1, 2], "emitted": float("inf")}, "bad_acceptance", True, 2),
    # One emitted count per sequence, but not one for each sequence: the default is counted.
    ({"accepted": [1, 2], "emitted": [1]}, "bad_acceptance", True, 2),
    ({"accepted": [1, 2], "emitted": [1, 2, 3]}, "bad_acceptance", True, 2),
    ({"accepted": [1, 2], "emitted": 2**63}, "bad_acceptance", True, 2),
    ({"accepted": [1], "batch_size": True}, "bad_batch_size", True, None),  # a flag, not a size
    ({"accepted": [1], "batch_size": "8"}, "bad_batch_size", True, None),
    ({"accepted": [1], "batch_size": float("nan")}, "bad_batch_size", True, None),
    ({"accepted": [1], "batch_size": -7}, "bad_batch_size", True, None),
    ({"accepted": [1], "batch_size": 2.5}, "bad_batch_size", True, None),
]


def _assert_flushed_within_a_second(obs: specobs.Observer) -> None:
    t0 = time.monotonic()
    assert obs.force_flush(5) is True
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize(("kwargs", "kind", "counts", "batch"), POISON,
                         ids=[repr(p[0])[:48] for p in POISON])
def test_poisoned_cycle_costs_only_its_own_value(kwargs, kind, counts, batch):
    obs, mem = observer()
    for _ in range(100):
        cycle(obs, GOOD, draft_length=K)
    cycle(obs, **{"draft_length": K, **kwargs})
    for _ in range(100):
        cycle(obs, GOOD, draft_length=K)
    _assert_flushed_within_a_second(obs)
    s = obs.snapshot()
    # Every cycle is kept; the neighbours' acceptance is whole.
    assert s.cycles_total == 201
    assert s.dropped_total() == 0
    assert {k: v for k, v in s.errors.items() if v} == {kind: 1}
    own = sum(kwargs["accepted"]) if counts else 0
    assert s.accepted_tokens_total == 200 * 3 + own
    assert s.draft_tokens_total == 200 * 2 * K + (K * len(kwargs["accepted"]) if counts else 0)
    assert s.batch_size.count == 200 + (batch is not None)
    assert s.batch_size.sum == 400 + (batch or 0)
    assert s.accept_length.count == 400 + (len(kwargs["accepted"]) if counts else 0)
    assert len(mem.cycles) == 201
    # Flushing keeps working: promptly True, again and again.
    for _ in range(3):
        cycle(obs, GOOD, draft_length=K)
        _assert_flushed_within_a_second(obs)
    assert obs.snapshot().cycles_total == 204
    obs.shutdown()


@pytest.mark.parametrize("k", [np.int64(K), np.int32(K), torch.tensor(K), float(K)],
                         ids=["np.int64", "np.int32", "torch 0-d", "integral float"])
def test_numpy_and_torch_scalar_draft_lengths_are_accepted(k):
    obs, _ = observer()
    for _ in range(10):
        cycle(obs, GOOD, draft_length=k)
    assert obs.force_flush(5) is True
    s = obs.snapshot()
    assert s.errors["bad_acceptance"] == 0
    assert s.accepted_tokens_total == 30 and s.draft_tokens_total == 10 * 2 * K
    obs.shutdown()


def test_poison_in_every_chunk_position_never_loses_neighbours():
    """A bad value at the start, middle and end of one resolver chunk (128 records)."""
    obs, _ = observer()
    bad = {0, 63, 127, 128, 255}
    for i in range(256):
        cycle(obs, [1, None] if i in bad else GOOD, draft_length=K)
    assert obs.force_flush(5) is True
    s = obs.snapshot()
    assert s.cycles_total == 256
    assert s.errors["bad_acceptance"] == len(bad)
    assert s.accepted_tokens_total == 3 * (256 - len(bad))
    obs.shutdown()


def test_nan_batch_size_never_poisons_the_histogram_sum():
    obs, _ = observer()
    cycle(obs, [1], batch_size=float("nan"))
    cycle(obs, [1], batch_size=3)
    assert obs.force_flush(5)
    s = obs.snapshot()
    assert s.batch_size.sum == 3 and s.batch_size.count == 1
    obs.shutdown()


@pytest.mark.parametrize("bad", ["x", True], ids=repr)
def test_begin_with_a_bad_batch_size_is_counted_not_raised(bad):
    obs, _ = observer()
    with obs.cycle(batch_size=bad) as c:
        c.mark("verify")
        c.mark("bookkeeping")
    with obs.cycle(batch_size=4) as c:
        c.mark("verify")
        c.mark("bookkeeping")
    assert obs.force_flush(5)
    s = obs.snapshot()
    assert s.cycles_total == 2 and s.errors["bad_batch_size"] == 1
    assert s.batch_size.count == 1 and s.batch_size.sum == 4
    obs.shutdown()


@pytest.mark.parametrize("bad", ["x", "4", b"4", "9" * 1_000_000, float("nan"), float("inf"),
                                 -1, object(), True], ids=lambda v: repr(v)[:12])
def test_set_requests_never_raises_and_keeps_the_last_good_value(bad, caplog):
    obs, _ = observer()
    obs.set_requests(running=3, waiting=1)
    with caplog.at_level("WARNING", logger="specobs"):
        obs.set_requests(running=bad, waiting=2)  # must not raise
    assert obs.force_flush(5)
    s = obs.snapshot()
    assert s.requests_running == 3.0 and s.requests_waiting == 2.0
    assert s.errors["bad_request_counts"] == 1
    # One bounded line, whatever the value's size.
    (line,) = [r.getMessage() for r in caplog.records if "set_requests" in r.getMessage()]
    assert "set_requests(running=...) must be a count >= 0" in line and len(line) < 300
    obs.shutdown()


def test_a_resolver_bug_drops_its_chunk_counted_and_flush_still_works(monkeypatch):
    """Not bad input but a bug inside resolution (its Python stages): what needed Python --
    here every cycle, the memory sink wants them all -- is counted as resolver_error and none
    of it applied, the cycles themselves stay counted by the ring, and force_flush returns True
    instead of waiting forever."""
    obs, mem = observer()
    for _ in range(5):
        cycle(obs, GOOD, draft_length=K)
    assert obs.force_flush(5)
    from specobs import _stages

    real = _stages.read_gpu  # a stage every chunk goes through
    calls = {"n": 0}

    def broken(*args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real(*args)

    monkeypatch.setattr(_stages, "read_gpu", broken)
    for _ in range(7):
        cycle(obs, GOOD, draft_length=K)
    _assert_flushed_within_a_second(obs)
    s = obs.snapshot()
    assert s.cycles_total == 12  # the ring's part of the failed chunk is counted
    assert s.dropped["resolver_error"] == 7 and s.errors["internal"] == 1
    assert len(mem.cycles) == 5  # the Python part of it is not: no resolved cycle reached sinks
    cycle(obs, GOOD, draft_length=K)
    assert obs.force_flush(5) is True
    assert obs.snapshot().cycles_total == 13
    assert len(mem.cycles) == 6
    obs.shutdown()


class _CostlySink(specobs.MemorySink):
    """Advances a fake thread clock by ``cost_ns`` per resolved cycle (the resolver's work)."""

    def __init__(self, clock: list[int], cost_ns: int) -> None:
        super().__init__(max_cycles=10)
        self.clock = clock
        self.cost_ns = cost_ns

    def on_cycles(self, cycles):
        self.clock[0] += self.cost_ns * len(cycles)
        super().on_cycles(cycles)


def test_resolver_holds_are_sized_by_time_not_by_count(monkeypatch):
    """Each GIL hold (a slice of records) is timed; slices over the target shrink in
    proportion, full slices under half of it double, so expensive records mean short holds and
    cheap ones few, long-enough holds. Driven with a fake thread clock, so nothing here depends
    on the machine's speed."""
    from specobs import _holds

    clock = [0]
    monkeypatch.setattr(time, "thread_time_ns", lambda: clock[0])
    sink = _CostlySink(clock, cost_ns=10_000)  # 10 µs per record
    obs = specobs.configure(sinks=[sink], clock="host", max_draft_length=K,
                            poll_interval_seconds=3600)
    r = obs._resolver
    assert r.tuning.slice_ns == _holds.SLICE_NS
    meter = r.tune(_holds.Tuning(slice_ns=200_000), _holds.HoldMeter())  # for 200 µs holds
    for _ in range(1000):
        cycle(obs, GOOD, draft_length=K)
    assert obs.force_flush(10)
    assert obs.snapshot().cycles_total == 1000
    # The first slice (CHUNK = 32 records, 320 µs) is over the target: the next ones hold 20.
    assert r.chunk == 20
    assert meter.max_hold_ns == 32 * 10_000
    assert meter.slices >= 1000 // 20
    sink.cost_ns = 1_000  # cheap records: full slices well under the target double
    for _ in range(3000):
        cycle(obs, GOOD, draft_length=K)
    assert obs.force_flush(10)
    assert obs.snapshot().cycles_total == 4000
    assert 100 <= r.chunk <= 200  # 20 -> 40 -> 80 -> 160: each under half the target
    assert meter.max_hold_ns == 32 * 10_000  # nothing held longer since
    obs.shutdown()


def test_a_cuda_copy_that_cannot_be_read_costs_its_own_cycle_counted_with_a_bounded_message(
    caplog: pytest.LogCaptureFixture,
):
    """The copy of a CUDA acceptance tensor is read once, by the resolver: a read that raises
    (the device lost, a driver error whose text is megabytes) costs that cycle's tokens, counted
    as ``bad_acceptance``, and its log line stays short. The cycle and its neighbours count."""
    from specobs.timing import FakeDeviceArray, FakeEventClock, FakeGpu, PendingCopy

    class Unreadable(PendingCopy):
        __slots__ = ()

        def read(self) -> list[int]:
            self.release()
            raise RuntimeError("device lost " + "x" * 1_000_000)

    class Clock(FakeEventClock):
        def copy_to_host(self, tensor):
            copy = super().copy_to_host(tensor)
            if copy is None or tensor.values != [9, 9]:
                return copy
            return Unreadable(copy.buffer, copy.length, copy.event, copy.release)

    gpu = FakeGpu()
    obs = specobs.configure(sinks=[], clock=Clock(gpu), max_draft_length=K,
                            poll_interval_seconds=3600)
    with caplog.at_level("WARNING", logger="specobs"):
        for values in ([1, 2], [9, 9], [2, 0]):
            cycle(obs, FakeDeviceArray(values), draft_length=K)
            gpu.run(1000)
        gpu.complete()
        assert obs.force_flush(5)
    s = obs.snapshot()
    assert s.cycles_total == 3
    assert {k: v for k, v in s.errors.items() if v} == {"bad_acceptance": 1}
    assert s.accepted_tokens_total == 5 and s.draft_tokens_total == 4 * K
    lines = [r.getMessage() for r in caplog.records if "copied acceptance" in r.getMessage()]
    assert len(lines) == 1 and "device lost" in lines[0] and len(lines[0]) < 400
    obs.shutdown(5)


# -- the resolver thread: supervised ---------------------------------------------------------


def _scraped_cycles(registry) -> float:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(registry).decode()
    return next(smp.value for fam in text_string_to_metric_families(text)
                for smp in fam.samples if smp.name == "specobs_cycles_total")


def _resolved_without_a_flush(registry, n: int, within: float = 30.0) -> bool:
    """Whether the scrape reaches ``n`` cycles by the resolver's own polls (no force_flush,
    which would drain on the caller's thread and hide a dead resolver)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if _scraped_cycles(registry) >= n:
            return True
        time.sleep(0.05)
    return False


def _resolver_alive() -> bool:
    import threading

    return any(t.name == "specobs-resolver" and t.is_alive() for t in threading.enumerate())


def _three_rounds_resolved_by_the_resolver_alone(
    obs: specobs.Observer, registry, per_round: int
) -> specobs.Snapshot:
    """Three rounds of ``per_round`` cycles, each scraped resolved before a flush; then the
    resolver is alive, a flush completes, and the snapshot is returned."""
    for i in range(1, 4):
        for _ in range(per_round):
            cycle(obs, GOOD, draft_length=K)
        assert _resolved_without_a_flush(registry, per_round * i), (i, _scraped_cycles(registry))
    assert _resolver_alive()
    assert obs.force_flush(5)
    return obs.snapshot()


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit(),
                                 asyncio.CancelledError(), RuntimeError("sink bug")],
                         ids=lambda e: type(e).__name__)
def test_a_sink_raising_anything_never_stops_the_resolver(exc, caplog):
    """A sink whose ``on_cycles`` raised ``SystemExit`` (a ``sys.exit()`` deep in a library),
    ``KeyboardInterrupt``, ``GeneratorExit`` or ``CancelledError`` ended the resolver thread for
    good: /metrics froze and nothing said so. Each raise is now the sink's loss alone, counted
    as ``sink_error`` and logged once; the scrape keeps up on the resolver's own polls."""
    from prometheus_client import CollectorRegistry

    class Raising(specobs.Sink):
        wants_cycles = True
        calls = 0

        def on_cycles(self, cycles):
            Raising.calls += 1
            raise exc

    registry = CollectorRegistry()
    with caplog.at_level("WARNING", logger="specobs"):
        obs = specobs.configure(sinks=[Raising(), specobs.PrometheusSink(registry=registry)],
                                clock="host", max_draft_length=K, poll_interval_seconds=0.02)
        try:
            s = _three_rounds_resolved_by_the_resolver_alone(obs, registry, 2000)
            assert s.cycles_total == 6000 and s.dropped_total() == 0
            assert s.errors["sink_error"] == Raising.calls >= 3
            assert s.errors["resolver_restart"] == 0
        finally:
            obs.shutdown(2)
    lines = [r.getMessage() for r in caplog.records if "from on_cycles" in r.getMessage()]
    assert len(lines) == 1 and f"sink Raising raised {type(exc).__name__}" in lines[0]


def test_a_resolver_loop_that_dies_anyway_is_started_again_and_counted(monkeypatch, caplog):
    """Whatever ends the resolver's loop outside a sink (here ``SystemExit`` from the thread-time
    read the loop makes between drains) no longer ends the thread: the supervisor starts the
    loop again, counts ``resolver_restart`` and logs it, and cycles keep being resolved."""
    from prometheus_client import CollectorRegistry

    from specobs import _aggregation

    real = _aggregation.Aggregation.read_thread_time
    failures = {"left": 2}

    def dying(self):
        import threading

        if threading.current_thread().name == "specobs-resolver" and failures["left"]:
            failures["left"] -= 1
            raise SystemExit(1)
        real(self)

    monkeypatch.setattr(_aggregation.Aggregation, "read_thread_time", dying)
    registry = CollectorRegistry()
    with caplog.at_level("WARNING", logger="specobs"):
        # A sink that wants every cycle keeps the loop in Python (not in the native pump),
        # polling every 0.02 s, so its thread-time reads come at once.
        obs = specobs.configure(sinks=[specobs.PrometheusSink(registry=registry),
                                       specobs.MemorySink()], clock="host",
                                max_draft_length=K, poll_interval_seconds=0.02)
        try:
            deadline = time.monotonic() + 30
            while failures["left"] and time.monotonic() < deadline:
                time.sleep(0.02)  # the loop reads thread times every 0.1 s: both raise
            assert failures["left"] == 0
            s = _three_rounds_resolved_by_the_resolver_alone(obs, registry, 1000)
            assert s.cycles_total == 3000 and s.dropped_total() == 0
            assert s.errors["resolver_restart"] == 2
        finally:
            obs.shutdown(2)
    lines = [r.getMessage() for r in caplog.records if "resolver thread ended" in r.getMessage()]
    assert len(lines) == 1 and "SystemExit" in lines[0]


@pytest.mark.parametrize("step", [-5_000, -10**15], ids=["5us", "1e15ns"])
@pytest.mark.parametrize("native", [True, False], ids=["ring_reads", "python_reads"])
def test_a_gpu_clock_stepping_back_is_counted_and_the_cycles_keep_their_counts(
        step, native, caplog):
    """Third hostile review, case 14: a GPU timeline that steps back between two marks (an end
    event before its start: a negative elapsed time) lost those cycles' GPU times with no drop
    counted, under a message about integer nanoseconds. Now each such cycle is counted as
    ``dropped_records{reason="clock_backwards"}``, keeps its host times and tokens, and one
    line says what was read and what was expected. The ring reading GPU times itself hands
    such a cycle to Python, which counts it the same way."""
    from prometheus_client import CollectorRegistry

    from specobs.timing.fake import FakeGpu, FakeNativeEventClock

    gpu = FakeGpu()
    clock = FakeNativeEventClock(gpu, pool_size=256, native=native)
    registry = CollectorRegistry()
    with caplog.at_level("WARNING", logger="specobs"):
        obs = specobs.configure(sinks=[specobs.PrometheusSink(registry=registry)], clock=clock,
                                sample_every=1, max_draft_length=K, poll_interval_seconds=0.01,
                                trace_head_rate=0.0)
        try:
            for i in range(20):
                with obs.cycle(batch_size=2) as c:
                    gpu.run(1000)
                    c.mark("verify")
                    gpu.run(2000 if i % 2 else step)  # even cycles: verify ends before it began
                    c.mark("bookkeeping")
                    gpu.run(500)
                    c.accept(GOOD, draft_length=K)
            gpu.completed_ns = 1 << 62  # everything recorded has completed
            assert obs.force_flush(10)
            s = obs.snapshot()
            scraped = {}
            for metric in registry.collect():
                for sample in metric.samples:
                    if sample.name == "specobs_exporter_dropped_records_total":
                        scraped[sample.labels["reason"]] = sample.value
        finally:
            obs.shutdown(2)
    assert s.cycles_total == 20 and s.accepted_tokens_total == 20 * sum(GOOD)
    assert s.phase_histograms[("verify", "host")].count == 20
    assert [s.phase_histograms[(p, "gpu")].count for p in s.phases] == [10, 10, 10]
    assert s.phase_histograms[("verify", "gpu")].sum == pytest.approx(10 * 2000e-9)
    assert {k: v for k, v in s.dropped.items() if v} == {"clock_backwards": 10}
    assert scraped["clock_backwards"] == 10
    lines = [r.getMessage() for r in caplog.records if "clock_backwards" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"read {step} ns for phase 'verify'" in lines[0] and "elapsed >= 0" in lines[0]
    assert not [r for r in caplog.records if "integer nanoseconds" in r.getMessage()]
