"""Diagnostic: are GPU phase times of sampled eager cycles inflated, and by what?"""

import statistics
import sys
import time

sys.path.insert(0, "benchmarks")
import torch
from gpu_overhead import Workload

import specobs

torch.cuda.init()
w = Workload(d=1024, target_layers=2, batch=8, k=4, graphs=False)
for _ in range(2000):
    w.draft()
    w.verify()
    w.bookkeeping()
torch.cuda.synchronize()


def observed_step(obs):
    """One draft-verify-bookkeeping step of the workload, observed as one cycle."""
    c = obs.begin()
    w.draft()
    c.mark("verify")
    w.verify()
    c.mark("bookkeeping")
    w.bookkeeping()
    c.end()


def run(label, poll, n=1500, every=1):
    mem = specobs.MemorySink(max_cycles=n)
    obs = specobs.configure(
        clock="cuda", sinks=[mem], sample_every=every, poll_interval_seconds=poll
    )
    t0 = time.perf_counter()
    for _ in range(n):
        observed_step(obs)
    torch.cuda.synchronize()
    el = time.perf_counter() - t0
    obs.force_flush(60)
    cs = [c for c in mem.cycles if c.gpu_ns]
    us = [c for c in mem.cycles if not c.gpu_ns]

    def med(xs, i, attr):
        return statistics.median(getattr(c, attr)[i] for c in xs) / 1e3 if xs else float("nan")

    print(
        f"{label:28s} cyc {el / n * 1e3:.3f} ms | sampled host "
        + " ".join(f"{med(cs, i, 'host_ns'):7.1f}" for i in range(3))
        + " | gpu "
        + " ".join(f"{med(cs, i, 'gpu_ns'):7.1f}" for i in range(3))
        + " | unsampled host "
        + " ".join(f"{med(us, i, 'host_ns'):7.1f}" for i in range(3))
        + " us"
    )
    obs.shutdown()


run("every, poll 10ms", 0.01)
run("every, poll 1000s (no resolver)", 1000)
run("1 in 4, poll 10ms", 0.01, every=4)
run("1 in 4, no resolver", 1000, every=4)
# host only
mem = specobs.MemorySink()
obs = specobs.configure(clock="host", sinks=[mem])
for _ in range(1500):
    observed_step(obs)
obs.force_flush()
print(
    "host clock only: host",
    [statistics.median(c.host_ns[i] for c in mem.cycles) / 1e3 for i in range(3)],
)
# public Event.record for comparison, no specobs
evs = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
res = []
for _ in range(1500):
    evs[0].record()
    w.draft()
    evs[1].record()
    w.verify()
    evs[2].record()
    w.bookkeeping()
    evs[3].record()
    evs[3].synchronize()
    res.append([evs[i].elapsed_time(evs[i + 1]) * 1e3 for i in range(3)])
print(
    "plain events (sync at end of cycle):", [statistics.median(r[i] for r in res) for i in range(3)]
)
