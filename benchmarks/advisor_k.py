"""The advisor (``SPEC-ADVICE-K``, :func:`specobs.tools._diagnosis.advise_k`) against measured
tokens/s: the demo engine run at k = 2..8 on one device, a steady batch, the same prompts.

For each k it measures tokens/s per sequence and asks the advisor, from that k's own
measurement, which k is best and what it gains. The claims checked (docs/diagnosis.md): the k
recommended from the default k = 4 is within 5% of the best measured tokens/s, and its predicted
gain within 15% of the realized one.

    PYTHONPATH=. python3 benchmarks/advisor_k.py --device cuda [--steps 400] [--batch 4]
        [--ks 2,3,4,5,6,8] [--verify-scaling 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

import specobs
from specobs.demo import build_engine
from specobs.tools import _breakdown as bd
from specobs.tools import _diagnosis as dg


def measure(k: int, device: str, steps: int, batch: int, scaling: float) -> dict[str, Any]:
    clock = "cuda" if device == "cuda" else "host"
    obs = specobs.configure(sinks=[specobs.MemorySink()], clock=clock,
                            sample_every=1 if clock == "cuda" else None, max_draft_length=8,
                            env={})
    try:
        engine = build_engine(device=device, cache_dir=tempfile.mkdtemp(), observer=obs, k=k,
                              max_batch=batch)
        text = engine.models.language.stream(40000, seed=4242)
        prompts = [text[i * 37: i * 37 + 8] for i in range(256)]
        handles: list[Any] = []
        submitted = [0]

        def keep_full() -> None:
            handles[:] = [h for h in handles if not h.done]
            while len(handles) < batch:
                handles.append(engine.submit(prompts[submitted[0] % len(prompts)], 128))
                submitted[0] += 1

        for _ in range(50):
            keep_full()
            engine.step()
        if device == "cuda":
            import torch

            torch.cuda.synchronize()
        assert obs.force_flush(10)
        before = obs.snapshot()
        t0 = time.perf_counter()
        for _ in range(steps):
            keep_full()
            engine.step()
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        assert obs.force_flush(30)
        after = obs.snapshot()
    finally:
        obs.shutdown(10)
    b = bd.breakdown(bd.snapshot_delta(after, before, elapsed))
    advice = dg.advise_k(b, scaling)
    return {
        "k": k, "sequence_tokens_per_second": b.sequence_tokens_per_second,
        "emitted_tokens_per_second": b.emitted_tokens_per_second,
        "conditional": [a for _, a in dg.conditional_acceptance(b)],
        "advice": None if advice is None else {
            "sentence": advice.sentence, "best_k": advice.evidence["best_k"],
            "predicted_gain": advice.evidence["predicted_gain"],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--ks", default="2,3,4,5,6,8")
    parser.add_argument("--verify-scaling", type=float, default=0.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = {}
    for k in (int(x) for x in args.ks.split(",")):
        r = measure(k, args.device, args.steps, args.batch, args.verify_scaling)
        results[k] = r
        adv = r["advice"] or {}
        print(f"k={k} per-sequence tok/s {r['sequence_tokens_per_second']:.1f}  conditional "
              f"{[round(a, 2) for a in r['conditional']]}  advice best_k={adv.get('best_k')} "
              f"gain={adv.get('predicted_gain', 0) * 100:+.1f}%", flush=True)
    speeds = {k: r["sequence_tokens_per_second"] for k, r in results.items()}
    best = max(speeds, key=lambda k: speeds[k])
    print(f"best measured k={best} at {speeds[best]:.1f} tok/s per sequence")
    if 4 in results and results[4]["advice"]:
        adv = results[4]["advice"]
        rec = int(adv["best_k"])
        if rec in speeds:
            print(f"from k=4: recommended k={rec}: {speeds[rec] / speeds[best] * 100:.1f}% of the "
                  f"best; predicted gain {adv['predicted_gain'] * 100:+.1f}%, realized "
                  f"{(speeds[rec] / speeds[4] - 1) * 100:+.1f}%")
        else:
            print(f"from k=4: recommended k={rec}, not measured")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
