"""What one ``accept()`` call costs the engine's thread, by form, on the ring in use.

    PYTHONPATH=. python benchmarks/accept_call.py [--calls 200000] [--rounds 9]
    python benchmarks/accept_call.py --trees OLD NEW      # two checkouts, built, side by side

Each round times, one after the other, ``calls`` calls of each form on one open cycle (a list of
8 accepted lengths, ``draft_length=4``; a later ``accept()`` replaces an earlier one, so the
cycle never fills): the accepted list by position, the same by name, and a Python method of the
same signature that does nothing (the floor of any call with these arguments). Medians over the
rounds, ns per call; ``nan`` where a form is refused. With ``--trees`` each checkout runs in a
subprocess of its own (``PYTHONPATH`` set to it), the trees alternating round by round, so the
machine's drift falls on both alike; the ratio of their medians is the figure to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

ACCEPTED = [1, 2, 3, 0, 4, 1, 2, 3]


class _Floor:
    def accept(self, accepted: Any, *, draft_length: Any = None, batch_size: Any = None,
               emitted: Any = None) -> None:
        pass


def _per_call_ns(fn: Any, calls: int) -> float:
    """ns per call; NaN where the form is refused (the native core before it took
    ``accepted=`` by name)."""
    try:
        fn()
    except TypeError:
        return float("nan")
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def one_round(calls: int) -> dict[str, float]:
    """ns per call of each form, once."""
    import specobs
    from specobs import _ring

    obs = specobs.configure(sinks=[specobs.MemorySink()], clock="host",
                            poll_interval_seconds=3600)
    try:
        c = obs.begin()
        floor = _Floor()
        acc = ACCEPTED
        out = {
            "floor": _per_call_ns(lambda: floor.accept(acc, draft_length=4), calls),
            "positional": _per_call_ns(lambda: c.accept(acc, draft_length=4), calls),
            "by name": _per_call_ns(lambda: c.accept(accepted=acc, draft_length=4), calls),
        }
        c.mark("verify")
        c.mark("bookkeeping")
        c.end()
        out["native"] = float(_ring.NATIVE)
        return out
    finally:
        obs.shutdown()


def _table(rows: dict[str, list[dict[str, float]]]) -> None:
    forms = ("positional", "by name", "floor")
    print(f"{'ring':<40}" + "".join(f"{f:>14}" for f in forms) + "   (median ns per call)")
    medians = {}
    for name, rounds in rows.items():
        medians[name] = {f: statistics.median(r[f] for r in rounds) for f in forms}
        core = "native" if rounds[0]["native"] else "python"
        print(f"{name + ' (' + core + ')':<40}"
              + "".join(f"{medians[name][f]:>14.1f}" for f in forms))
    if len(medians) == 2:
        (a, ma), (b, mb) = medians.items()
        print(f"{b} / {a}:" + "".join(f"  {f} {mb[f] / ma[f]:.3f}" for f in forms))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--trees", nargs=2, metavar=("OLD", "NEW"),
                    help="two checkouts (each built in place) to compare side by side")
    ap.add_argument("--json-round", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json_round:
        print(json.dumps(one_round(args.calls)))
        return
    if not args.trees:
        _table({"this checkout": [one_round(args.calls) for _ in range(args.rounds)]})
        return
    rows: dict[str, list[dict[str, float]]] = {t: [] for t in args.trees}
    for _ in range(args.rounds):
        for tree in args.trees:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--json-round",
                 "--calls", str(args.calls)],
                env=env, cwd=tree, capture_output=True, text=True, check=True)
            rows[tree].append(json.loads(done.stdout.splitlines()[-1]))
    _table(rows)


if __name__ == "__main__":
    main()
