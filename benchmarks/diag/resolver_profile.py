"""Diagnostic: where does the resolver's time go inside a GPU loop?

Runs the synthetic EAGLE cycle of ``benchmarks/gpu_overhead.py`` with specobs (adaptive sampling
and every cycle GPU-timed), reading CUDA events through torch's ``Event`` methods and through the
runtime directly (``CudaEventClock.bind_thread``), and reports for each run:

* every CUDA call the resolver makes, timed: calls per sampled record, wall and thread-CPU
  microseconds per call (wall well above CPU means waiting: for a lock in the driver, or for
  the GIL after a call that released it);
* a cProfile of the resolver thread (the top functions by own time);
* the resolver's CPU per cycle and its longest GIL hold, and the loop's cycles per second.

    PYTHONPATH=. python benchmarks/diag/resolver_profile.py --workloads small-graph

``--pyspy SECONDS`` also runs one loop in a child process and records it with py-spy (when
the py-spy binary is on PATH and the machine lets it read another process).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch
from gpu_overhead import build, warm

import specobs
from specobs._holds import HoldMeter


class CallTimer:
    """Wraps a clock method: calls, wall ns and thread-CPU ns."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.calls = 0
        self.wall = 0
        self.cpu = 0

    def __call__(self, *args: Any) -> Any:
        w = time.perf_counter_ns()
        c = time.thread_time_ns()
        try:
            return self.fn(*args)
        finally:
            self.cpu += time.thread_time_ns() - c
            self.wall += time.perf_counter_ns() - w
            self.calls += 1


def run(wl: Any, k: int, batch: int, n: int, *, every: bool, direct: bool,
        profile: bool) -> dict[str, Any]:
    obs = specobs.configure(clock="cuda", sinks=[], sample_every=1 if every else None)
    clock = obs.clock
    if not direct:
        clock.bind_thread = lambda: False  # type: ignore[method-assign]
    q = clock.query = CallTimer(clock.query)  # type: ignore[method-assign]
    e = clock.elapsed_ns = CallTimer(clock.elapsed_ns)  # type: ignore[method-assign]
    res = obs._resolver
    prof = cProfile.Profile() if profile else None
    inner = res.drain
    lock = threading.Lock()

    def drain() -> int:
        if prof is None or threading.current_thread() is not res._thread:
            return inner()
        with lock:
            prof.enable()
            try:
                return inner()
            finally:
                prof.disable()

    res.drain = drain  # type: ignore[method-assign]

    def loop(m: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(m):
            c = obs.begin(batch)
            wl.draft()
            c.mark("verify")
            wl.verify()
            c.mark("bookkeeping")
            c.accept(wl.bookkeeping(), draft_length=k)
            c.end()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    loop(max(200, n // 4))  # warm: the sampling interval settles
    obs.force_flush(timeout_seconds=30)
    s0 = obs.snapshot()
    q.calls = q.wall = q.cpu = e.calls = e.wall = e.cpu = 0
    meter = res.tune(meter=HoldMeter())
    if prof is not None:
        prof.clear()
    el = loop(n)
    obs.force_flush(timeout_seconds=30)
    s = obs.snapshot()
    cycles = s.cycles_total - s0.cycles_total
    sampled = s.sampled_cycles_total - s0.sampled_cycles_total
    out: dict[str, Any] = {
        "cycles_per_s": n / el,
        "sampled": sampled,
        "interval": s.sampling_interval,
        "resolver_us_per_cycle": (s.cpu_seconds["resolver"] - s0.cpu_seconds["resolver"])
        / max(cycles, 1) * 1e6,
        "max_hold_us": meter.max_hold_ns / 1e3,
        "overhead_pct": s.overhead_ratio * 100,
        "direct": bool(getattr(clock, "_direct_checked", False)),
    }
    for name, t in (("query", q), ("elapsed", e)):
        out[name] = {
            "calls_per_sampled": t.calls / max(sampled, 1),
            "wall_us": t.wall / max(t.calls, 1) / 1e3,
            "cpu_us": t.cpu / max(t.calls, 1) / 1e3,
        }
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
        out["profile"] = buf.getvalue()
    obs.shutdown(timeout_seconds=5)
    return out


def pyspy(wl_name: str, seconds: float, out_dir: str) -> None:
    exe = shutil.which("py-spy")
    if exe is None:
        print("py-spy: not on PATH")
        return
    code = (
        "import sys, time; sys.path.insert(0, 'benchmarks');"
        "import torch, specobs; from gpu_overhead import build;"
        f"w = build({wl_name!r}); obs = specobs.configure(clock='cuda', sinks=[]);"
        f"end = time.time() + {seconds + 8};"
        "\nwhile time.time() < end:\n"
        "    c = obs.begin(w.batch); w.draft(); c.mark('verify'); w.verify();"
        " c.mark('bookkeeping'); c.accept(w.bookkeeping(), draft_length=w.k); c.end()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(6)
        path = os.path.join(out_dir, "pyspy_resolver.txt")
        r = subprocess.run(
            [exe, "record", "--pid", str(child.pid), "--duration", str(int(seconds)),
             "--rate", "2000", "--threads", "--format", "raw", "--output", path,
             "--nonblocking"],
            capture_output=True, text=True, timeout=seconds + 30,
        )
        print(f"py-spy rc {r.returncode}: {r.stderr.strip()[-400:]}")
        if r.returncode == 0 and os.path.exists(path):
            # The resolver thread's stacks, heaviest first (raw format: "stack count").
            rows = []
            with open(path) as f:
                for line in f:
                    stack, _, count = line.rstrip().rpartition(" ")
                    if "_resolver.py" in stack:  # the resolver thread's stacks
                        rows.append((int(count), stack))
            rows.sort(reverse=True)
            total = sum(c for c, _ in rows) or 1
            print(f"py-spy: {total} resolver samples; top leaf frames:")
            leaves: dict[str, int] = {}
            for c, st in rows:
                leaf = st.split(";")[-1]
                leaves[leaf] = leaves.get(leaf, 0) + c
            for leaf, c in sorted(leaves.items(), key=lambda kv: -kv[1])[:12]:
                print(f"  {c / total * 100:5.1f}%  {leaf}")
    except Exception as exc:
        print(f"py-spy failed: {exc!r}")
    finally:
        child.kill()
        child.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="small-graph,small-graph-cudaacc")
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--pyspy", type=float, default=0.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    torch.cuda.init()
    for name in args.workloads.split(","):
        w = build(name)
        warm(w, 1.0)
        print(f"\n== {name}")
        for every in (False, True):
            for direct in (False, True):
                r = run(w, w.k, w.batch, args.cycles, every=every, direct=direct,
                        profile=not every)
                label = f"{'every' if every else 'default'} {'direct' if direct else 'torch'}"
                print(f"{label:<16} {r['cycles_per_s']:8.0f} cyc/s  sampled {r['sampled']} "
                      f"(1 in {r['interval']})  resolver {r['resolver_us_per_cycle']:.1f} "
                      f"us/cycle  longest hold {r['max_hold_us']:.0f} us  self-reported "
                      f"{r['overhead_pct']:.2f}%  direct={r['direct']}")
                for call in ("query", "elapsed"):
                    c = r[call]
                    print(f"   {call:<8} {c['calls_per_sampled']:5.2f} per sampled record, "
                          f"{c['wall_us']:6.2f} us wall, {c['cpu_us']:6.2f} us CPU per call")
                if "profile" in r:
                    lines = r["profile"].splitlines()
                    start = next((i for i, ln in enumerate(lines) if "tottime" in ln), 0)
                    print("\n".join("   " + ln for ln in lines[start:start + 15]))
    if args.pyspy:
        pyspy(args.workloads.split(",")[0], args.pyspy, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
