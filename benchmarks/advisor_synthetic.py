"""The advisor's cost model against the synthetic engine (tests/_synthetic_engine.py): every
forward of tests/test_advice_model.py (the roofline too, whose knee a line cannot follow), at
batches 1, 8 and 32, from every starting k from 2 to 8. Per case: the advised k and its
tokens/s as a fraction of the truth's best, and the predicted speedup against the realized one
at the starting k and at the other ks it weighed. The truth is the engine's exact expectation;
the windows are what specobs's exporter would count over ``--cycles`` sequence-cycles per
batch.

    PYTHONPATH=. python3 benchmarks/advisor_synthetic.py [--cycles 16000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from specobs.tools import _diagnosis as dg
from tests._synthetic_engine import Synthetic
from tests.test_advice_model import FORWARDS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=16000,
                        help="sequence-cycles per window (cycles = this / batch)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name in sorted(FORWARDS):
        for batch in (1, 8, 32):
            e = Synthetic(FORWARDS[name])
            best = e.best_k(batch)
            top = e.tokens_per_second(best, batch)
            cells, worst, worst_pred, far = [], 1.0, 0.0, 0.0
            for start in range(2, 9):
                w = dg.window(e.window(start, batch, args.cycles // batch))
                found = {f.code: f for f in dg.diagnose(w)}
                adv = found["SPEC-ADVICE-K"]
                chosen = int(adv.evidence["best_k"]) if adv.severity == "info" else start  # type: ignore[arg-type]
                frac = e.tokens_per_second(chosen, batch) / top
                speed = next(f for c, f in found.items() if c.startswith("SPEC-SPEEDUP"))
                pred, real = speed.evidence["predicted"], speed.evidence["realized"]
                off = pred / real - 1 if isinstance(pred, float) and isinstance(real, float) \
                    else None
                # The speedup predicted at the other ks from this window, against the truth.
                for key, value in adv.evidence.items():
                    if key.startswith("predicted_speedup_k") and isinstance(value, float):
                        kk = int(key.removeprefix("predicted_speedup_k"))
                        far = max(far, abs(value / e.speedup(kk, batch) - 1))
                worst = min(worst, frac)
                worst_pred = max(worst_pred, abs(off or 0.0))
                cells.append(f"{start}->{chosen} {frac * 100:.1f}%")
                rows.append({"forward": name, "batch": batch, "start_k": start,
                             "advised_k": chosen, "best_k": best, "fraction_of_best": frac,
                             "predicted_over_realized": off})
            print(f"{name:8} batch {batch:2}: best k={best}; " + ", ".join(cells)
                  + f"; worst {worst * 100:.1f}% of the best; predicted speedup off by at most "
                  f"{worst_pred * 100:.1f}% at the measured k, {far * 100:.1f}% at the others",
                  flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)


if __name__ == "__main__":
    main()
