"""The resolver's own cost per cycle, one thread, no GPU: the drain of 256 records at a time.

Tells whether the resolver's CPU per cycle inside a GPU loop (``benchmarks/gpu_overhead.py``
reports it) is its own work or the loop's doing: run on the same host, it gives the resolver's
speed there with nothing else running, and with ``--spinners N`` with N processes spinning on
other cores (as a worker spinning in a CUDA synchronisation does).

    PYTHONPATH=. python benchmarks/diag/resolver_drain.py --batch 8 64 --spinners 0 1

``--paths`` compares the compiled bucketing (``specobs/_speedups.c``) with the pure-Python
reference in the same process.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import specobs
from specobs import _bucketing


def _spin() -> None:
    while True:
        pass


def drain_us(batch: int, rounds: int) -> float:
    obs = specobs.configure(clock="host", sinks=[])
    res = obs._resolver
    res.poll = 3600.0  # this thread drains; the resolver thread only sleeps
    acc = [i % 4 for i in range(batch)]

    def cycles(n: int) -> None:
        for _ in range(n):
            c = obs.begin(batch)
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept(acc, draft_length=4)
            c.end()

    for _ in range(20):
        cycles(256)
        res.drain()
    total = 0
    for _ in range(rounds):
        cycles(256)
        t = time.thread_time_ns()
        res.drain()
        total += time.thread_time_ns() - t
    obs.shutdown(timeout_seconds=5)
    return total / rounds / 256 / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--spinners", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--paths", nargs="+", default=["compiled", "reference"],
                    help="bucketing: the compiled speedups and/or the pure-Python reference")
    args = ap.parse_args()
    compiled = _bucketing.bucket, _bucketing.host_chunk, _bucketing.count_lengths
    for spinners in args.spinners:
        procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(spinners)]
        for p in procs:
            p.start()
        try:
            for b in args.batch:
                for path in args.paths:
                    if path == "compiled" and not _bucketing.COMPILED:
                        continue
                    _bucketing.bucket, _bucketing.host_chunk, _bucketing.count_lengths = (
                        compiled if path == "compiled"
                        else (_bucketing.bucket_py, _bucketing.host_chunk_py,
                              _bucketing.count_lengths_py)
                    )
                    runs = sorted(drain_us(b, args.rounds) for _ in range(3))
                    print(f"spinners {spinners} batch {b} {path}: resolver {runs[1]:.2f} "
                          f"us/cycle (min {runs[0]:.2f}, max {runs[2]:.2f})", flush=True)
        finally:
            for p in procs:
                p.terminate()


if __name__ == "__main__":
    main()
