"""The resolver finds the completed records with few event queries (each is a CUDA call costing
microseconds inside a busy GPU loop), and never takes a record whose events are pending."""

from __future__ import annotations

import specobs
from specobs.timing import FakeDeviceArray, FakeEventClock, FakeGpu


class CountingClock(FakeEventClock):
    def __init__(self, gpu: FakeGpu) -> None:
        super().__init__(gpu, pool_size=4096)
        self.queries = 0

    def query(self, event):
        self.queries += 1
        return super().query(event)

    def elapsed_ns(self, start, end):  # not counted: the resolver calls it on completed events
        assert FakeEventClock.query(self, start) and FakeEventClock.query(self, end)
        return int(end.ts - start.ts)


def make(clock):
    mem = specobs.MemorySink()
    obs = specobs.configure(sinks=[mem], clock=clock, sample_every=4,
                            poll_interval_seconds=3600)
    return obs, mem


def cycle(obs, gpu, i):
    c = obs.begin()
    gpu.run(10)
    c.mark("verify")
    gpu.run(20)
    c.mark("bookkeeping")
    c.accept(FakeDeviceArray([i % 3, 1]), draft_length=4)
    gpu.run(5)
    c.end()


def test_a_completed_prefix_is_found_in_log_queries_and_pending_records_wait():
    gpu = FakeGpu()
    clock = CountingClock(gpu)
    obs, mem = make(clock)
    for i in range(100):
        cycle(obs, gpu, i)
    gpu.complete()
    for i in range(100, 160):  # enqueued after the GPU's completion point: pending
        cycle(obs, gpu, i)
    clock.queries = 0
    obs._resolver.drain()  # one pass
    assert [c.index for c in mem.cycles] == list(range(100))
    assert clock.queries < 40  # a few per slice; one per record would be 101
    gpu.complete()
    assert obs.force_flush()
    s = obs.snapshot()
    assert [c.index for c in mem.cycles] == list(range(160))
    assert s.accepted_tokens_total == sum(i % 3 + 1 for i in range(160))
    assert s.sampled_cycles_total == 40
    assert [c.gpu_ns for c in mem.cycles][:2] == [[10, 20, 5], None]
    obs.shutdown()


def test_after_a_stream_switch_every_record_is_queried_in_order():
    gpu = FakeGpu()
    clock = CountingClock(gpu)
    clock.stream_switched = True  # events on two streams may complete out of order
    obs, mem = make(clock)
    for i in range(50):
        cycle(obs, gpu, i)
    gpu.complete()
    for i in range(50, 60):
        cycle(obs, gpu, i)
    clock.queries = 0
    obs._resolver.drain()
    assert [c.index for c in mem.cycles] == list(range(50))
    assert clock.queries >= 51
    gpu.complete()
    assert obs.force_flush()
    assert obs.snapshot().cycles_total == 60
    obs.shutdown()
