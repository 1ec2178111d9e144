"""What the pure-Python ring's test clock costs each cycle, two ways: the clock function swapped
when ``tick`` is set (as shipped: ``_now`` is ``perf_counter_ns`` itself while ``tick`` is 0),
against a plain ``tick`` attribute checked on every read (as ``specobs/_core/core.h``'s
``ring_now`` does). The public-API loop at batch 8, host clock, the two ways alternating.

    PYTHONPATH=. python benchmarks/diag/ring_tick_clock.py [--cycles 20000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ["SPECOBS_CORE"] = "python"

import specobs
from specobs import _ring


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    assert not _ring.NATIVE
    obs = specobs.configure(sinks=[], clock="host")
    ring = obs._recorder.ring
    perf = time.perf_counter_ns

    def checking() -> int:  # the per-read check, as the C clock does it
        if ring._tick:
            ring._fake_now += ring._tick
            return int(ring._fake_now)
        return perf()

    def loop() -> float:
        t = time.perf_counter()
        for _ in range(args.cycles):
            with obs.cycle(batch_size=8) as c:
                c.mark("verify")
                c.mark("bookkeeping")
                c.accept([1, 2, 3, 4, 0, 1, 2, 3], draft_length=4)
        return (time.perf_counter() - t) / args.cycles * 1e6

    swapped, checked = [], []
    for _ in range(args.rounds):
        ring._now = perf
        swapped.append(loop())
        ring._now = checking
        checked.append(loop())
    ring._now = perf
    a, b = statistics.median(swapped), statistics.median(checked)
    print(f"µs per cycle, median of {args.rounds}: swapped clock {a:.2f}, checked per read "
          f"{b:.2f}, ratio {b / a:.3f}")
    obs.shutdown(5)


if __name__ == "__main__":
    main()
