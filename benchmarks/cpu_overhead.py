"""CPU cost of specobs: hot path per phase boundary, and the resolver's CPU per cycle.

    PYTHONPATH=. python benchmarks/cpu_overhead.py

Host clock only (no GPU here). The hot-path figure is per boundary (begin, each mark, end) with
the loop's own cost subtracted; the resolver figure is its thread CPU time per resolved cycle,
read from specobs's own self-metric (``specobs_exporter_cpu_time_seconds_total``).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable

import specobs
from specobs.timing import FakeEventClock, FakeGpu

CHUNK = 256


def _timed_chunks(
    obs: specobs.Observer, n: int, acc: list[int] | None, between: Callable[[], None]
) -> int:
    """Nanoseconds spent in ``n`` cycles, run in chunks of CHUNK; ``between`` runs untimed."""
    pc = time.perf_counter_ns
    total = 0
    rng = range(CHUNK)
    for _ in range(max(n // CHUNK, 1)):
        t0 = pc()
        if acc is not None:
            for _ in rng:
                c = obs.begin(8)
                c.mark("verify")
                c.mark("bookkeeping")
                c.accept(acc, draft_length=4)
                c.end()
        else:
            for _ in rng:
                c = obs.begin(8)
                c.mark("verify")
                c.mark("bookkeeping")
                c.end()
        total += pc() - t0
        between()
    return total


def hot_path_ns(n: int, *, accept: bool, fake_events: bool) -> float:
    """Worker-thread cost per phase boundary, the same loop on a disabled observer subtracted.

    The loop runs in chunks of 256 cycles; between chunks, untimed, the ring is drained (as the
    resolver would, every poll) so the figure is the worker's steady state, not the cost of a
    queue that grows without bound. The resolver itself is parked: its CPU is measured below.
    """
    gpu = FakeGpu()
    clock = FakeEventClock(gpu, pool_size=4 * 4096) if fake_events else "host"
    obs = specobs.configure(clock=clock, sinks=[], sample_every=1 if fake_events else None,
                            poll_interval_seconds=1000, queue_size=4 * CHUNK)
    obs._recorder.wake_at = 8 * CHUNK  # never woken from the hot path
    acc = [1, 2, 3, 0, 4, 1, 2, 3] if accept else None

    def drain() -> None:
        if fake_events:
            gpu.complete()  # the fake GPU finishes; resolved cycles hand their events back
        obs.force_flush()

    el = _timed_chunks(obs, n, acc, drain)
    off = specobs.configure(enabled=False)
    base = _timed_chunks(off, n, acc, lambda: None)
    gpu.complete()
    obs.shutdown(timeout_seconds=60)
    return (el - base) / (max(n // CHUNK, 1) * CHUNK) / 4  # four boundaries per cycle


def resolver_us_per_cycle(n: int, batch: int) -> float:
    gpu = FakeGpu()
    obs = specobs.configure(clock=FakeEventClock(gpu, pool_size=4 * (n + 8)), sinks=[],
                            sample_every=1, poll_interval_seconds=1000, queue_size=n + 16)
    acc = [i % 5 for i in range(batch)]
    for _ in range(n):
        c = obs.begin(batch)
        gpu.run(100)
        c.mark("verify")
        gpu.run(100)
        c.mark("bookkeeping")
        c.accept(acc, draft_length=4)
        c.end()
    gpu.complete()
    before = obs.snapshot().cpu_seconds["resolver"]
    obs.force_flush(timeout_seconds=120)
    s = obs.snapshot()
    obs.shutdown()
    assert s.cycles_total == n
    return (s.cpu_seconds["resolver"] - before) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    n = args.cycles
    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{platform.processor() or 'cpu'}; {n} cycles x {args.repeats} repeats (median)")
    rows = [
        ("hot path, host clock, per boundary", "ns",
         lambda: hot_path_ns(n, accept=False, fake_events=False), 500),
        ("hot path, host clock + accept(list of 8), per boundary", "ns",
         lambda: hot_path_ns(n, accept=True, fake_events=False), None),
        ("hot path, with (fake) events every cycle, per boundary", "ns",
         lambda: hot_path_ns(n // 10, accept=False, fake_events=True), None),
        ("resolver CPU per cycle, batch 8", "us", lambda: resolver_us_per_cycle(n // 5, 8), None),
        ("resolver CPU per cycle, batch 64", "us", lambda: resolver_us_per_cycle(n // 5, 64), None),
    ]
    print(f"{'measure':<58} {'median':>10} {'min':>10}  target")
    for name, unit, fn, target in rows:
        vals = [fn() for _ in range(args.repeats)]
        t = f"<= {target} {unit}" if target else ""
        print(f"{name:<58} {statistics.median(vals):8.1f}{unit:>2} {min(vals):8.1f}{unit:>2}  {t}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
