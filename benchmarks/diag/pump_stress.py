"""Stress the pump: N times, 60,000 cycles beside a worker that lets go of the GIL (the tests'
stream, tests/test_nogil_drain.py), then a flush.

    PYTHONPATH=. python benchmarks/diag/pump_stress.py N [cuda]

On a flush that does not complete in 10 s it prints the resolver's and the ring's state and every
thread's stack (faulthandler), and exits 1. Run three at once on a small machine to load it: that
is how a lost cycle was found (``begin()`` moved the head past its slot before storing it OPEN, and
a pass of the pump right behind the head read the slot as void). ``cuda``: CUDA initialised first,
so the default clock is the CUDA one.
"""

from __future__ import annotations

import faulthandler
import sys

import specobs
from specobs._holds import HoldMeter
from tests.test_nogil_drain import host_cycles


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[2] == "cuda":
        import torch

        torch.zeros(1, device="cuda")
    faulthandler.dump_traceback_later(40 * int(sys.argv[1]), exit=True)
    for k in range(int(sys.argv[1])):
        obs = specobs.configure(sinks=[], poll_interval_seconds=0.001, queue_size=1 << 15)
        obs._resolver.tune(meter=HoldMeter())  # why the pump came back, for a hang's line
        host_cycles(obs, 60_000)  # the stream the drain's and the pump's tests run
        if not obs.force_flush(10):
            r = obs._resolver
            ring = r.rec.ring
            print(f"HANG at run {k}: consumed {r.consumed}, enqueued {r.rec.enqueued}, waiting "
                  f"{len(ring)}, drains {r.drains}, returns {r.meter.pump_returns}, pumping "
                  f"{ring.pumping}, begun {ring.begun}, drained {ring.drained}, pump_walked "
                  f"{ring.pump_walked}, counted {obs.snapshot().cycles_total}, pending "
                  f"{ring.pending(100)}", flush=True)
            faulthandler.dump_traceback(all_threads=True)
            return 1
        obs.shutdown(5)
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
