"""What ``Observer.set_requests`` pays for a text value: ``float()`` on it (as before, which
parses all of it and copies it into its error message) against the type check that refuses it
unread (as now). Median of ``--repeats`` calls each, per size.

    PYTHONPATH=. python benchmarks/diag/set_requests_text.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import specobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    obs = specobs.configure(sinks=[], clock="host")
    for size in (10**3, 10**6, 10**7):
        text = "x" * size

        def parse(text: str = text) -> None:
            try:
                float(text)
            except ValueError:
                pass

        def now(text: str = text) -> None:
            obs.set_requests(running=text)

        times = {}
        for name, fn in (("float() as before", parse), ("set_requests now", now)):
            samples = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t)
            times[name] = statistics.median(samples)
        print(f"{size:>9} chars: " + ", ".join(f"{k} {v * 1e6:.1f} µs" for k, v in times.items()))
    obs.shutdown(5)


if __name__ == "__main__":
    main()
