"""What handing a cycle's acceptance to specobs costs the engine's thread, way by way, on a GPU.

Each way is timed on the host (``perf_counter_ns`` around the one line, median of many cycles,
the ways interleaved cycle by cycle so the machine's drift falls on all alike), inside a loop that
keeps the GPU busy with a matmul per cycle, as an engine's loop does: every CUDA call is only a
launch.

* ``list``: ``c.accept(host_list)`` -- what vLLM V1 and SGLang's host lists hand it;
* ``cuda``: ``c.accept(cuda_tensor)`` -- the native core's copy to pinned memory;
* ``sub``: ``cuda_tensor - 1`` alone -- what the SGLang hook computed on the worker for every
  deferred step before it read the host list at the settle instead;
* ``sub+clamp``: ``(cuda_tensor - 1).clamp_(min=0)`` alone -- vLLM model runner V2's hook;
* ``sub+cuda``: ``c.accept(cuda_tensor - 1)`` -- a hook that subtracts the bonus token, then
  hands the tensor over.

    PYTHONPATH=. python benchmarks/acceptance_paths.py [--cycles 20000] [--batches 8,64]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import specobs

#: Cycles run before any is timed (the clock's start, first launches).
WARMUP = 500


def time_ways(obs: specobs.Observer, ways: dict[str, Callable[[Any], Any]], n: int, *,
              batch: int, work: Callable[[], Any],
              sync: Callable[[], Any]) -> dict[str, float]:  # fmt: skip
    """Median host ns of each way, a callable given the open cycle: ``n`` cycles after
    :data:`WARMUP`, the ways taking turns cycle by cycle (the machine's drift falls on all
    alike), ``work`` launched before each cycle so the device stays ahead of the host, ``sync``
    every 64 cycles so the launch queue stays short (launches, not back-pressure)."""
    pc = time.perf_counter_ns
    names = list(ways)
    times: dict[str, list[int]] = {w: [] for w in names}
    for i in range(n + WARMUP):
        way = names[i % len(names)]
        work()
        with obs.cycle(batch_size=batch) as c:
            c.mark("verify")
            c.mark("bookkeeping")
            t = pc()
            ways[way](c)
            dt = pc() - t
        if i >= WARMUP:
            times[way].append(dt)
        if i % 64 == 0:
            sync()
    return {w: statistics.median(v) for w, v in times.items()}


def _ways(lens: list[int], dev: Any, plus: Any) -> dict[str, Callable[[Any], Any]]:
    """The ways of handing one batch's acceptance (``plus``: what the engines hold, accepted
    drafts plus the bonus token)."""
    return {
        "list": lambda c: c.accept(lens, draft_length=4),
        "cuda": lambda c: c.accept(dev, draft_length=4),
        "sub": lambda c: plus - 1,
        "sub+clamp": lambda c: (plus - 1).clamp_(min=0),
        "sub+cuda": lambda c: c.accept(plus - 1, draft_length=4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=20000)
    ap.add_argument("--batches", default="8,64")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    work = torch.randn(1024, 1024, device="cuda")
    obs = specobs.configure(sinks=[], clock="cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; host ns per call, "
          f"median of {args.cycles} cycles per way")
    for batch in (int(b) for b in args.batches.split(",")):
        lens = [i % 5 for i in range(batch)]
        dev = torch.tensor(lens, dtype=torch.int32, device="cuda")
        ways = _ways(lens, dev, dev + 1)
        med = time_ways(obs, ways, args.cycles, batch=batch, work=lambda: work @ work,
                        sync=torch.cuda.synchronize)  # fmt: skip
        row = ", ".join(f"{w} {med[w] / 1e3:.2f} us" for w in ways)
        print(f"batch {batch}: {row}; sub / cuda {med['sub'] / med['cuda']:.2f}, "
              f"sub+clamp / cuda {med['sub+clamp'] / med['cuda']:.2f}")
    obs.force_flush(10)
    snap = obs.snapshot()
    print(f"cycles {snap.cycles_total}, native copies {obs._recorder.ring.native_copies}, "
          f"errors {dict(snap.errors)}")
    obs.shutdown(5)


if __name__ == "__main__":
    main()
