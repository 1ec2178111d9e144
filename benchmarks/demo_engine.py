"""The demo engine's own figures: cycles/s, acceptance and the phase split, as specobs sees them.

Keeps ``--batch`` requests in flight for ``--seconds`` with the default model, healthy and with
each fault, and prints what the observer measured (GPU clock on CUDA, host clock always).

    PYTHONPATH=. python benchmarks/demo_engine.py --device cpu
    PYTHONPATH=. python benchmarks/demo_engine.py --device cuda
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time

import specobs
from specobs.demo import build_engine


def run(device: str, seconds: float, batch: int, fault: str | None, engine_kwargs: dict,
        sample_every: int | None) -> dict[str, object]:
    obs = specobs.configure(sinks=[], clock="auto", sample_every=sample_every)
    engine = build_engine(device=device, observer=obs, max_batch=batch, **engine_kwargs)
    engine.fault = fault
    tok = engine.tokenizer
    rng = random.Random(0)
    words = [tok.decode([i]) for i in range(4, 200)]
    stop = threading.Event()
    done_tokens = [0]

    def client() -> None:
        while not stop.is_set():
            prompt = " ".join(rng.choice(words) for _ in range(rng.randint(4, 16)))
            h = engine.submit(tok.encode(prompt), max_tokens=64)
            out = h.wait(timeout=60)
            done_tokens[0] += len(out)

    engine.start()
    # Warm up (CUDA graphs, caches), then measure a window.
    threads = [threading.Thread(target=client, daemon=True) for _ in range(batch)]
    for t in threads:
        t.start()
    time.sleep(min(3.0, seconds / 3))
    obs.force_flush(timeout_seconds=10)
    s0 = obs.snapshot()
    t0 = time.perf_counter()
    time.sleep(seconds)
    obs.force_flush(timeout_seconds=10)
    s1 = obs.snapshot()
    el = time.perf_counter() - t0
    stop.set()
    engine.stop()
    obs.shutdown()
    cycles = s1.cycles_total - s0.cycles_total
    res: dict[str, object] = {
        "cycles_per_s": cycles / el,
        "tokens_per_s": (s1.emitted_tokens_total - s0.emitted_tokens_total) / el,
        "acceptance": (s1.accepted_tokens_total - s0.accepted_tokens_total)
        / max(1, s1.draft_tokens_total - s0.draft_tokens_total),
        "mean_batch": (s1.batch_size.sum - s0.batch_size.sum) / max(1, cycles),
        "sampled": s1.sampled_cycles_total - s0.sampled_cycles_total,
    }
    for clock in ("gpu", "host"):
        ms = {}
        for p in s1.phases:
            n = s1.phase_count(p, clock) - s0.phase_count(p, clock)
            tot = s1.phase_seconds_sum(p, clock) - s0.phase_seconds_sum(p, clock)
            ms[p] = tot / n * 1e3 if n else None
        res[f"{clock}_ms"] = ms
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--faults", default="none,wrong-hidden-layers,slow-verify")
    args = ap.parse_args(argv)
    import torch

    print(f"device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
          + f", torch {torch.__version__}, batch {args.batch}, {args.seconds:.0f} s per row")
    print(f"{'fault':<22}{'cycles/s':>9}{'tok/s':>8}{'accept':>8}{'batch':>6}   "
          "phase ms per cycle: gpu (draft/verify/bookkeeping) | host")
    for f in args.faults.split(","):
        fault = None if f == "none" else f
        r = run(args.device, args.seconds, args.batch, fault, {}, 1)

        def fmt(d: object) -> str:
            assert isinstance(d, dict)
            return "/".join("-" if v is None else f"{v:.2f}" for v in d.values())

        print(f"{f:<22}{r['cycles_per_s']:9.1f}{r['tokens_per_s']:8.0f}{r['acceptance']:8.3f}"
              f"{r['mean_batch']:6.1f}   {fmt(r['gpu_ms'])} | {fmt(r['host_ms'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
