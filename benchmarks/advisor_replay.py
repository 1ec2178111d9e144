"""The advisor (``SPEC-ADVICE-K``) replayed over recorded runs of ``benchmarks/advisor_k.py``:
each k's recorded means (conditional acceptance, phase means on both clocks, verify's scaling)
rebuilt as a window and given to :func:`specobs.tools._diagnosis.advise_k` as it is now, its
advice checked against the tokens/s the run measured. This is how a change to the model is
checked against every run recorded (benchmarks/runs/advisor/, docs/diagnosis.md "The model as
it stands") without a GPU.

    PYTHONPATH=. python3 benchmarks/advisor_replay.py benchmarks/runs/advisor/h200-run*-gpu.json
        [--speed summed|median|running]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from specobs import catalog
from specobs.tools import _diagnosis as dg
from tests.test_diagnosis import delta


def advice(r: dict[str, Any]) -> tuple[int, float]:
    """The advised k and its predicted gain from one k's recorded means (the k measured and 0
    where the finding is ``ok``: no other k gains ADVICE_MIN_GAIN)."""
    cond = r["conditional"]
    positions = [math.prod(cond[: i + 1]) for i in range(len(cond))]
    gpu = r["gpu_phase_seconds"] or None
    d = delta(cycles=r["cycles"], batch=r["batch"], host=r["phase_seconds"], gpu=gpu,
              gpu_cycles=r["cycles"] if gpu else 0.0, positions=positions, k=int(r["k"]))
    if r.get("plain_step_seconds"):
        d.gauges.add(catalog.BASELINE_SEQUENCE_TOKENS.name, {"source": "demo_measured"},
                     1.0 / r["plain_step_seconds"])
    w = dg.window(d)
    f = dg.advise_k(w.breakdown, dg.model_of([w]), w.drafted_first)
    if f is None:
        raise SystemExit(f"k={r['k']}: the recorded means give no advice")
    if f.severity == "ok":
        return int(r["k"]), 0.0
    best, gain = f.evidence["best_k"], f.evidence["predicted_gain"]
    assert isinstance(best, float) and isinstance(gain, float)
    return int(best), gain


def speeds(results: dict[int, dict[str, Any]], how: str) -> dict[int, float]:
    key = {"summed": "summed_sequence_tokens_per_second", "median": "sequence_tokens_per_second",
           "running": "running_sequence_tokens_per_second"}[how]
    return {k: r[key] for k, r in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--speed", choices=("summed", "median", "running"), default=None,
                        help="the measured tokens/s (default: summed for a GPU run, the median "
                        "round over running time for a CPU one)")
    parser.add_argument("--ks", default="2,3,4,5,6")
    args = parser.parse_args()
    errors: dict[int, list[float]] = {}
    for path in args.runs:
        results = {int(k): r for k, r in json.loads(path.read_text())["results"].items()}
        gpu = any(r["gpu_phase_seconds"] for r in results.values())
        speed = speeds(results, args.speed or ("summed" if gpu else "running"))
        best = max(speed.values())
        cells = []
        for k in (int(x) for x in args.ks.split(",")):
            to, gain = advice(results[k])
            realized = speed[to] / speed[k] - 1
            errors.setdefault(k, []).append(gain - realized)
            within = abs(gain - realized) <= 0.15 * abs(realized) or gain == realized == 0
            cells.append(f"k={k}->{to} {gain * 100:+.1f}/{realized * 100:+.1f}"
                         f"{'' if within else ' x'} ({speed[to] / best * 100:.0f}%)")
        print(f"{path.name}: " + " | ".join(cells))
    print("mean error (predicted - realized), points: " + ", ".join(
        f"k={k} {statistics.fmean(e) * 100:+.1f}" for k, e in errors.items()))


if __name__ == "__main__":
    main()
