"""``specobs doctor`` against a GPU loop that hands acceptance as a CUDA tensor: the overhead
check must name the acceptance copies (``exporter_cpu{component="acceptance_copy"}``), and with
acceptance as a host list the same loop must not.

The synthetic EAGLE-style cycle of ``benchmarks/gpu_overhead.py`` (small, CUDA graphs, a
sub-millisecond cycle), specobs's defaults and its Prometheus endpoint on a free port;
``specobs doctor URL --json`` runs in a subprocess while the loop runs. Prints each run's
overhead check and the copies' exported time per cycle.

    PYTHONPATH=. python benchmarks/diag/doctor_cuda_copies.py [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import torch

import specobs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gpu_overhead import build, warm


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one(workload: str, seconds: float) -> dict[str, object]:
    w = build(workload)
    warm(w)
    port = free_port()
    obs = specobs.configure(clock="cuda", sinks=[specobs.PrometheusSink(port=port)])
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        k = w.k
        t_end = time.monotonic() + 2.0  # the sampler settles before doctor's first scrape
        doctor: subprocess.Popen[str] | None = None
        n = 0
        while True:
            c = obs.begin(w.batch)
            w.draft()
            c.mark("verify")
            w.verify()
            c.mark("bookkeeping")
            c.accept(w.bookkeeping(), draft_length=k)
            c.end()
            n += 1
            if doctor is None and time.monotonic() >= t_end:
                doctor = subprocess.Popen(
                    [sys.executable, "-m", "specobs.cli", "doctor", url, "--json",
                     "--wait", str(seconds)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if doctor is not None and doctor.poll() is not None:
                break
        torch.cuda.synchronize()
        assert doctor is not None
        out, err = doctor.communicate()
        report = json.loads(out)
        checks = {c["name"]: c for c in report["checks"]}
        s = obs.snapshot()
        return {
            "workload": workload, "cycles": n, "doctor_exit": doctor.returncode,
            "overhead": checks.get("overhead"),
            "exporter_cpu": checks.get("exporter cpu"),
            "gauge": s.overhead_ratio,
            "acceptance_copy_us_per_cycle": s.cpu_seconds.get("acceptance_copy", 0.0)
            / max(s.cycles_total, 1) * 1e6,
            "stderr": err[-2000:],
        }
    finally:
        obs.shutdown(5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    results = [one(wl, args.seconds) for wl in ("small-graph-cudaacc", "small-graph")]
    for r in results:
        print(json.dumps(r, indent=1, default=str))
    cuda, host = results
    ok = ("acceptance_copy_ratio" in (cuda["overhead"] or {}).get("data", {})  # type: ignore[union-attr]
          and "acceptance_copy_ratio" not in (host["overhead"] or {}).get("data", {}))  # type: ignore[union-attr]
    print("doctor names the copies for the CUDA tensor only:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
