"""The cost of ``Observer.request_finished`` on the calling thread, per call.

    python3 benchmarks/request_finished.py [--calls N] [--repeats R]

Three shapes: untraced (the common call), traced (an exemplar bucket: an ``Exemplar`` and a
``time_ns`` more), and a request that drafted nothing; the resolver runs meanwhile, as it does in
an engine. Prints the best of R runs of N calls, in nanoseconds per call. A request finishes a
few hundred times less often than a cycle, so even a microsecond here is noise beside the
cycle's own calls.
"""

from __future__ import annotations

import argparse
import time

import specobs


def _best(calls: int, repeats: int, **kwargs: int) -> float:
    obs = specobs.configure(sinks=[], clock="host", env={})
    f = obs.request_finished
    best = float("inf")
    try:
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                f(**kwargs)
            best = min(best, (time.perf_counter_ns() - t0) / calls)
    finally:
        obs.shutdown(2.0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    shapes = {
        "untraced (0.55)": {"drafted": 40, "accepted": 22},
        "traced, exemplar bucket (0.05)": {"drafted": 40, "accepted": 2, "trace_id": 1 << 100},
        "drafted nothing": {"drafted": 0, "accepted": 0},
    }
    for name, kwargs in shapes.items():
        print(f"{name:32s} {_best(args.calls, args.repeats, **kwargs):7.0f} ns/call")


if __name__ == "__main__":
    main()
