"""What a resolver slice's GIL hold is made of on this machine: the Python before the walk, the
Python after it, and how much of that is the Python itself against the same code run warm.

The public-API loop of benchmarks/cpu_budget.py (host clock, list acceptance, a MemorySink) runs
``--cycles`` cycles; each slice's two stretches with the GIL held (thread CPU from the slice's
start to the walk letting go of it, and from the walk taking it back to the slice's end) are
read from the ring's walk stamps. Then the cost of the first and of a second call of the same
small function right after a walk (``_fold.drops_now``), wall ns: the first Python
after the walk runs on caches the walk (and the worker, on the other CPU) emptied.

    PYTHONPATH=. python benchmarks/diag/hold_floor.py [--batch 8] [--cycles 100000]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import specobs
from specobs import _fold, _resolver
from specobs._holds import HoldMeter


def pct(v: list[int], p: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))] / 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cycles", type=int, default=100_000)
    args = ap.parse_args()
    R: Any = _resolver.Resolver
    pre: list[int] = []
    post: list[int] = []
    first: list[int] = []
    second: list[int] = []
    drain_locked, resolve = R._drain_locked, R._resolve
    pc = time.perf_counter_ns

    def timed_drain(self: Any, box: list[int], chunk: int) -> int:
        ring = self.rec.ring
        t0 = time.thread_time_ns()
        n = drain_locked(self, box, chunk)
        t1 = time.thread_time_ns()
        if ring.walk_count and ring.walk_cpu_out >= t0:
            pre.append(ring.walk_cpu_out - t0)
            post.append(t1 - ring.walk_cpu_in)
        return n

    def timed_resolve(self: Any, chunk: Any, clock: Any) -> Any:
        counts = self.rec.ring.counters()
        t0 = pc()
        _fold.drops_now(self.rec, counts)
        t1 = pc()
        _fold.drops_now(self.rec, counts)
        first.append(t1 - t0)
        second.append(pc() - t1)
        return resolve(self, chunk, clock)

    R._drain_locked, R._resolve = timed_drain, timed_resolve
    acc = [i % 5 for i in range(args.batch)]
    obs = specobs.configure(clock="host", sinks=[specobs.MemorySink(max_cycles=0)])

    def loop(n: int) -> None:
        for _ in range(n):
            with obs.cycle(batch_size=args.batch) as c:
                c.mark("verify")
                c.mark("bookkeeping")
                c.accept(acc, draft_length=4)

    loop(2000)
    obs.force_flush(5)
    for v in (pre, post, first, second):
        v.clear()
    res = obs._resolver
    meter = res.tune(meter=HoldMeter())
    loop(args.cycles)
    obs.force_flush(5)
    holds = list(meter.holds)
    print(f"batch {args.batch}, {args.cycles} cycles: {len(holds)} slices, {len(pre)} with a "
          f"walk without the GIL")
    for name, v in (("slice's longest stretch under the GIL", holds),
                    ("  before the walk", pre), ("  after the walk", post),
                    ("first drops_now() after the walk (wall)", first),
                    ("the same drops_now() again (wall)", second)):
        if v:
            print(f"{name:40s} p50 {pct(v, .5):7.1f}  p90 {pct(v, .9):7.1f}  "
                  f"max {max(v) / 1e3:7.1f} us")
    obs.shutdown(5)
    R._drain_locked, R._resolve = drain_locked, resolve


if __name__ == "__main__":
    main()
