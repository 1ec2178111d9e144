"""The resolver's GIL holds with the pump and without it, side by side in one process.

    PYTHONPATH=. python benchmarks/pump_holds.py --cycles 200000 --rounds 4 --batch 8

The loop of benchmarks/cpu_budget.py (host clock, list acceptance, ``MemorySink(max_cycles=0)``,
a worker that lets go of the GIL for ~8 us a cycle as one waiting on its GPU), in alternating
rounds: the native ring's pump (``Tuning.use_pump``, on by default), the loop of waits
and drains alone (``False``), and a disabled observer (the floor). Per variant, over the loop
only (the final flush is left out: it is the caller's, not the steady state): process CPU per
cycle above the floor, the resolver's holds of the GIL (thread CPU of each stretch between two
points where it let go of it) -- how many a second, p50, p90 and the longest -- and why the pump
came back to Python.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import specobs
from specobs import _ring
from specobs._holds import HoldMeter, Tuning

_WORK = bytes(16384)


def _cycles(obs: specobs.Observer, n: int, acc: list[int]) -> tuple[float, float]:
    """``n`` cycles: (process CPU seconds, wall seconds), without a flush."""
    work = hashlib.sha256
    cpu0 = time.process_time()
    w0 = time.perf_counter()
    for _ in range(n):
        c = obs.begin(batch_size=len(acc))
        c.mark("verify")
        work(_WORK)
        c.mark("bookkeeping")
        c.accept(acc, draft_length=4)
        c.end()
    return time.process_time() - cpu0, time.perf_counter() - w0


def _pct(xs: list[int], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] / 1e3


def run(n: int, rounds: int, batch: int) -> dict[str, dict[str, float]]:
    acc = [i % 5 for i in range(batch)]
    rows: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for variant in ("pump", "no pump", "disabled"):
            gc.collect()
            if variant == "disabled":
                obs = specobs.configure(enabled=False)
                cpu, wall = _cycles(obs, n, acc)
                rows.setdefault(variant, {}).setdefault("cpu_s", []).append(cpu)
                continue
            obs = specobs.configure(clock="host", sinks=[specobs.MemorySink(max_cycles=0)])
            res = obs._resolver
            res.tune(Tuning(use_pump=variant == "pump"))
            _cycles(obs, 2000, acc)  # warm
            obs.force_flush(30)
            meter = res.tune(meter=HoldMeter())
            cpu, wall = _cycles(obs, n, acc)
            holds = list(meter.holds)
            returns = dict(meter.pump_returns)
            assert obs.force_flush(60)
            s = obs.snapshot()
            obs.shutdown()
            assert s.cycles_total + s.dropped_total() == n + 2000
            row = rows.setdefault(variant, {})
            for key, value in (
                ("cpu_s", cpu),
                ("holds_per_s", len(holds) / wall),
                ("hold_p50_us", _pct(holds, 0.5)),
                ("hold_p90_us", _pct(holds, 0.9)),
                ("hold_max_us", max(holds, default=0) / 1e3),
                ("holds_over_20us", sum(h > 20_000 for h in holds)),
                ("dropped", s.dropped_total()),
                ("python_returns", sum(returns.values())),
            ):
                row.setdefault(key, []).append(float(value))
            print(f"  {variant}: pump returns {returns}", file=sys.stderr)
    floor = statistics.median(rows["disabled"]["cpu_s"])
    out: dict[str, dict[str, float]] = {}
    for variant in ("pump", "no pump"):
        r = rows[variant]
        out[variant] = {k: statistics.median(v) for k, v in r.items() if k != "cpu_s"}
        out[variant]["hold_max_us"] = max(r["hold_max_us"])
        out[variant]["cpu_us_per_cycle"] = (statistics.median(r["cpu_s"]) - floor) / n * 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args(argv)
    if not _ring.NATIVE:
        print("the native core is not built: nothing to compare")
        return 1
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}; {args.cycles} cycles x {args.rounds} rounds, "
          f"batch {args.batch}")
    out = run(args.cycles, args.rounds, args.batch)
    keys = list(out["pump"])
    print("| | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for variant, r in out.items():
        print(f"| {variant} | " + " | ".join(f"{r[k]:.2f}" for k in keys) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
