"""Where a resolver slice's GIL hold goes, stage by stage (thread CPU ns), in a GPU loop.

Wraps the resolver's stages (poll, traces, the ring's drain, resolve, fold, sampler) and its
whole slice, runs a small CUDA-graph-free loop of ~0.2 ms cycles with specobs's defaults (no
sink), and prints p50 / p90 / max of each. The wrappers add ~0.3 us a call; read the stages
against each other, not as absolute costs.

    PYTHONPATH=. python benchmarks/diag/resolver_stages.py [--seconds 4] [--cuda-acceptance]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import specobs
from specobs import _resolver, _stages
from specobs._holds import HoldMeter

STAGES: dict[str, list[int]] = {}


def timed(name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            STAGES.setdefault(name, []).append(time.thread_time_ns() - t)
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--cuda-acceptance", action="store_true")
    args = ap.parse_args()
    import torch

    R = _resolver.Resolver
    for name in ("_drain_locked", "_resolve", "_fold", "_adapt", "_adapt_some"):
        setattr(R, name, timed(name, getattr(R, name)))
    for name in ("poll", "read_gpu", "validate"):
        setattr(_stages, name, timed(name, getattr(_stages, name)))
    for cls, name in ((_stages.Traces, "pick"), (_stages.NativeReads, "take")):
        setattr(cls, name, timed(f"{cls.__name__}.{name}", getattr(cls, name)))
    torch.cuda.init()
    x = torch.randn(512, 512, device="cuda")
    acc_cuda = torch.tensor([1, 2, 0, 3], device="cuda")
    obs = specobs.configure(sinks=[], clock="cuda")
    meter = obs._resolver.tune(meter=HoldMeter())
    ring = obs._recorder.ring
    real_drain_into = ring.drain_into

    class RingProxy:
        def __getattr__(self, name: str) -> Any:
            return getattr(ring, name)

        def __len__(self) -> int:
            return len(ring)

    proxy: Any = RingProxy()
    proxy.drain_into = timed("ring.drain_into (CPU incl. walks)", real_drain_into)
    proxy.poll = timed("ring.poll", ring.poll)
    obs._recorder.ring = proxy
    t0 = time.time()
    n = 0
    while time.time() - t0 < args.seconds:
        with obs.cycle(batch_size=4) as c:
            for _ in range(2):
                x @ x
            c.mark("verify")
            x @ x
            c.mark("bookkeeping")
            c.accept(acc_cuda if args.cuda_acceptance else [1, 2, 0, 3], draft_length=4)
        n += 1
    torch.cuda.synchronize()
    obs.force_flush(10)
    hs = sorted(meter.holds)
    print(f"cycles {n}, slices {meter.slices}, holds p50 {hs[len(hs) // 2] / 1e3:.0f} / p90 "
          f"{hs[int(len(hs) * 0.9)] / 1e3:.0f} / max {hs[-1] / 1e3:.0f} us, native gpu "
          f"{ring.native_gpu_cycles}, walked {ring.nogil_cycles}")
    for name, v in STAGES.items():
        v = sorted(v)
        print(f"  {name:36s} n={len(v):6d} p50={v[len(v) // 2] / 1e3:7.1f} "
              f"p90={v[int(len(v) * 0.9)] / 1e3:7.1f} max={v[-1] / 1e3:7.1f} us")
    obs.shutdown(5)


if __name__ == "__main__":
    main()
