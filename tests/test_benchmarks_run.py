"""The CPU benchmarks still run against the package as it is.

benchmarks/*.py reach into the package (a recorder's ring, the resolver's counters, the demo's
engines) and are run by hand, so a refactor can leave one broken until somebody next measures
(``cpu_overhead.py`` read a recorder queue the ring had replaced). Each runs here with the
smallest arguments, in a subprocess from the checkout, and must exit 0 with its result lines;
no figure is checked (timings belong to benchmarks/RESULTS.md, not to tests). GPU-only
benchmarks are run by ``benchmarks/gpu_run.sh`` on the device.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: (script and arguments, text its output must hold).
RUNS = [
    (["cpu_overhead.py", "--cycles", "2048", "--repeats", "1"],
     "hot path, host clock, per boundary"),
    (["cpu_budget.py", "--cycles", "2000", "--repeats", "1", "--batches", "8", "--no-scrape"],
     "longest resolver GIL hold, batch 8"),
    (["pump_holds.py", "--cycles", "2000", "--rounds", "1", "--batch", "8"], "| no pump |"),
    (["export_overhead.py", "--seconds", "0.5", "--repeats", "1"],
     "/metrics HTTP round trip"),
    (["demo_engine.py", "--device", "cpu", "--seconds", "1", "--faults", "none"], "\nnone "),
    (["advisor_k.py", "--device", "cpu", "--ks", "3,4", "--steps", "20", "--rounds", "1",
      "--builds", "2", "--threads", "1"], "from k=4: recommended k="),
    (["accept_call.py", "--calls", "2000", "--rounds", "1"], "this checkout ("),
    (["advisor_replay.py", str(ROOT / "benchmarks" / "runs" / "advisor" / "h200-run9-gpu.json")],
     "mean error (predicted - realized), points: k=2 "),
]


@pytest.mark.parametrize(("argv", "expected"), RUNS, ids=[r[0][0] for r in RUNS])
def test_the_benchmark_runs(argv: list[str], expected: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPECOBS_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / argv[0]), *argv[1:]],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert expected in done.stdout, done.stdout[-3000:]
