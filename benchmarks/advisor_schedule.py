"""The k for each band of batch sizes (``SPEC-ADVICE-SCHEDULE``) against a sweep: the demo engine
at every k of ``--ks`` and every batch of ``--batches``, interleaved on one device
(:func:`advisor_k.measure_all`), its plain step measured by the engine's probe (k = 0). The
schedule is read from the windows at ``--start-k`` alone, one per batch size, as a server that
ran that k under varying load would give them; at each batch size the k it chose is checked
against the sweep's best there (the claim in docs/diagnosis.md: within 3% of its tokens/s).

    PYTHONPATH=. python3 benchmarks/advisor_schedule.py --device cuda --batches 1,4,16,32
        [--ks 1,2,3,4,5,6,7,8] [--start-k 4] [--steps 300] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import advisor_k as ak

from specobs.tools import _diagnosis as dg


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="1,4,16,32")
    parser.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--start-k", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    ks = sorted({int(x) for x in args.ks.split(",")} | {args.start_k})
    configs = ak.measure_all([(k, b) for b in batches for k in ks], args.device, args.steps,
                             args.rounds)
    rows: list[dict[str, Any]] = []
    windows = []
    for b in batches:
        results = {k: ak.result(configs[(k, b)]) for k in ks}
        speeds = {k: r["summed_sequence_tokens_per_second"] for k, r in results.items()}
        plains = [r["baseline_tokens_per_second"] for r in results.values()
                  if r["baseline_tokens_per_second"]]
        speeds[0] = sum(plains) / len(plains)
        start = configs[(args.start_k, b)]
        baseline = results[args.start_k]["baseline_tokens_per_second"]
        windows.append(dg.window(ak.summed([d for c in start for d in c.deltas], baseline)))
        rows.append({"batch": b, "speeds": speeds})
    bands, choices = dg.schedule(windows, [dg.model_of([w]) for w in windows])
    print("bands: " + ", ".join(f"{x.lo}-{'' if x.hi is None else x.hi}: k={x.k}"
                                f"{'' if x.measured else ' (not measured)'}" for x in bands))
    ok = True
    for row, choice in zip(rows, choices, strict=True):
        speeds = row["speeds"]
        best = max(speeds, key=lambda k: speeds[k])
        if choice.k not in speeds:
            print(f"batch {row['batch']}: schedule k={choice.k}, not swept")
            ok = False
            continue
        frac = speeds[choice.k] / speeds[best]
        row.update({"chosen_k": choice.k, "best_k": best, "fraction_of_best": frac,
                    "within_3_percent": frac >= 0.97})
        ok &= frac >= 0.97
        print(f"batch {row['batch']}: tokens/s per sequence "
              + ", ".join(f"k={k} {v:.0f}" for k, v in sorted(speeds.items()))
              + f"; best k={best}, schedule k={choice.k} ({frac * 100:.1f}% of the best; "
              f"within 3%: {frac >= 0.97})", flush=True)
    print(f"every batch within 3%: {ok}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rows": rows, "bands": [vars(x) for x in bands], "args": vars(args)},
                      out, indent=2, default=str)


if __name__ == "__main__":
    main()
