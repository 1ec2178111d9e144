"""The diagnosis's host-bound signals on a real GPU: the demo engine on CUDA, healthy and with
the ``sync-between-phases`` fault, with CUDA graphs and eagerly, every cycle timed on both clocks.

For each case it prints the per-phase means on the GPU and host clocks, the cycles' means, the
tokens/s, and what :func:`specobs.tools._diagnosis.host_bound` and ``cycle_bound`` conclude
(docs/diagnosis.md: SPEC-HOST-BOUND, SPEC-HOST-LOCKSTEP, SPEC-HOST-OVERLAPPED).

    PYTHONPATH=. python3 benchmarks/diag/sync_fault_gpu.py [--steps 400] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

import specobs
from specobs.demo import build_engine
from specobs.tools import _breakdown as bd
from specobs.tools import _diagnosis as dg


def run_case(fault: str | None, graphs: bool, steps: int, batch: int) -> dict[str, object]:
    obs = specobs.configure(sinks=[specobs.MemorySink()], clock="cuda", sample_every=1,
                            max_draft_length=8, env={})
    try:
        engine = build_engine(device="cuda", cache_dir=tempfile.mkdtemp(), observer=obs,
                              cuda_graphs=graphs, max_batch=batch)
        text = engine.models.language.stream(20000, seed=4242)
        prompts = [text[i * 37: i * 37 + 8] for i in range(64)]

        handles: list[object] = []
        submitted = [0]

        def keep_full() -> None:
            # Always `batch` sequences in flight: a steady batch on both sides of the switch.
            handles[:] = [h for h in handles if not h.done]  # type: ignore[attr-defined]
            while len(handles) < batch:
                handles.append(engine.submit(prompts[submitted[0] % len(prompts)], 200))
                submitted[0] += 1
        # Warm up (graph capture, allocator) before the measured window.
        for _ in range(50):
            keep_full()
            engine.step()
        torch.cuda.synchronize()
        assert obs.force_flush(10)
        before = obs.snapshot()
        engine.fault = fault
        t0 = time.perf_counter()
        for _ in range(steps):
            keep_full()
            engine.step()
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        assert obs.force_flush(30)
        after = obs.snapshot()
    finally:
        obs.shutdown(10)
    b = bd.breakdown(bd.snapshot_delta(after, before, elapsed))
    host_f, cycle_f = dg.host_bound(b), dg.cycle_bound(b)
    phases = {p: {c: b.stats[(p, c)].mean_seconds for c in ("gpu", "host")} for p in b.phases}
    return {
        "fault": fault, "cuda_graphs": graphs, "batch": batch, "cycles": b.cycles,
        "gpu_cycles": b.cycle_counts.get("gpu"), "elapsed_seconds": elapsed,
        "emitted_tokens_per_second": b.emitted_tokens_per_second,
        "cycle_seconds": dict(b.cycle_mean_seconds), "phases": phases,
        "host_bound": [host_f.code, host_f.sentence, host_f.evidence],
        "cycle_bound": [cycle_f.code, cycle_f.sentence],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = []
    for graphs in (True, False):
        for fault in (None, "sync-between-phases"):
            r = run_case(fault, graphs, args.steps, args.batch)
            results.append(r)
            ph = r["phases"]
            assert isinstance(ph, dict)
            print(f"graphs={graphs!s:5} fault={fault!s:20} "
                  f"tok/s={r['emitted_tokens_per_second']:8.1f} "
                  f"cycle gpu/host={r['cycle_seconds']}", flush=True)
            for p, v in ph.items():
                print(f"    {p:12} gpu {v['gpu'] * 1e6 if v['gpu'] else float('nan'):9.1f} us"
                      f"   host {v['host'] * 1e6 if v['host'] else float('nan'):9.1f} us")
            print(f"    {r['host_bound'][0]}: {r['host_bound'][1]}")
            print(f"    {r['cycle_bound'][0]}: {r['cycle_bound'][1]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)


if __name__ == "__main__":
    main()
