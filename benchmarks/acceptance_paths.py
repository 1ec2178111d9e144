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

import torch

import specobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=20000)
    ap.add_argument("--batches", default="8,64")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    pc = time.perf_counter_ns
    work = torch.randn(1024, 1024, device="cuda")
    obs = specobs.configure(sinks=[], clock="cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; host ns per call, "
          f"median of {args.cycles} cycles per way")
    for batch in (int(b) for b in args.batches.split(",")):
        lens = [i % 5 for i in range(batch)]
        dev = torch.tensor(lens, dtype=torch.int32, device="cuda")
        plus = dev + 1  # what the engines hold: accepted drafts plus the bonus token
        ways = ("list", "cuda", "sub", "sub+clamp", "sub+cuda")
        times: dict[str, list[int]] = {w: [] for w in ways}
        for i in range(args.cycles + 500):
            way = ways[i % len(ways)]
            work @ work  # the GPU stays ahead of the host, as in an engine's loop
            with obs.cycle(batch_size=batch) as c:
                c.mark("verify")
                c.mark("bookkeeping")
                t = pc()
                if way == "list":
                    c.accept(lens, draft_length=4)
                elif way == "cuda":
                    c.accept(dev, draft_length=4)
                elif way == "sub":
                    plus - 1
                elif way == "sub+clamp":
                    (plus - 1).clamp_(min=0)
                else:
                    c.accept(plus - 1, draft_length=4)
                dt = pc() - t
            if i >= 500:
                times[way].append(dt)
            if i % 64 == 0:
                torch.cuda.synchronize()  # the queue stays short: launches, not back-pressure
        med = {w: statistics.median(v) for w, v in times.items()}
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
