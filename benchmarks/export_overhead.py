"""Everything specobs costs on the worker's CPU with Prometheus and OTLP both on.

A worker loop paced at 1,000 cycles/s on the CPU (host clock; three phases; acceptance for a
batch of 8 with k=4), with a PrometheusSink scraped every 5 s over HTTP and an OtlpSink pushing
metrics (default interval, 10 s) and traces (0.1% head sampling, the default) to a real OTLP
receiver over gRPC.
The receiver and the scraper run in a separate process, as Prometheus and a Collector would, so
their CPU is not counted. The same loop then runs with specobs disabled. Reports:

* specobs CPU per cycle = (process CPU with specobs - process CPU without) / cycles, and its
  breakdown from specobs's own self-metrics (resolver, scrapes, OTLP export);
* /metrics scrape time (HTTP round trip and collector only) with every label combination
  populated;
* OTLP export CPU per exported span.

    PYTHONPATH=. python benchmarks/export_overhead.py --seconds 20
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import specobs

PEER = r"""
import sys, threading, time, urllib.request
from tests._otlp_receiver import OtlpReceiver
r = OtlpReceiver().start()
print(r.grpc_endpoint, flush=True)
times = []
stop = threading.Event()
def scrape(url):
    while not stop.wait(5.0):
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(url) as resp:
                resp.read()
        except OSError:  # the endpoint went away at the end of a run
            break
        times.append(time.perf_counter() - t0)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "scrape":
        stop.clear(); times.clear()
        threading.Thread(target=scrape, args=(arg,), daemon=True).start()
        print("ok", flush=True)
    elif cmd == "report":
        stop.set()
        med = sorted(times)[len(times) // 2] if times else 0.0
        print(len(r.spans()), med, flush=True)
        r.clear()
    elif cmd == "quit":
        break
r.stop()
"""


class Peer:
    """Prometheus-and-Collector stand-in in its own process: an OTLP receiver and a scraper."""

    def __init__(self) -> None:
        import subprocess

        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PEER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, cwd=root, env={**os.environ, "PYTHONPATH": root},
        )
        assert self.proc.stdout is not None
        self.grpc_endpoint = self.proc.stdout.readline().strip()

    def ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self) -> None:
        self.ask("quit")
        self.proc.wait(10)


RATE = 1000
ACC = [1, 2, 3, 0, 4, 1, 2, 3]


def worker(obs: specobs.Observer, seconds: float, out: dict[str, float] | None = None) -> int:
    """Paced loop: 1,000 cycles/s; the phases do no work so specobs is all that costs CPU."""
    t_cpu = time.thread_time()
    period = 1.0 / RATE
    n = int(seconds * RATE)
    start = time.perf_counter()
    for i in range(n):
        c = obs.begin(8)
        c.mark("verify")
        c.mark("bookkeeping")
        c.accept(ACC, draft_length=4)
        c.end()
        target = start + (i + 1) * period
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    if out is not None:
        out["worker_cpu_s"] = time.thread_time() - t_cpu
    return n


def run(seconds: float, enabled: bool, peer: Peer) -> dict[str, float]:
    if enabled:
        prom = specobs.PrometheusSink(port=0)
        otlp = specobs.OtlpSink(endpoint=peer.grpc_endpoint, protocol="grpc")
        obs = specobs.configure(sinks=[prom, otlp], clock="host", trace_head_rate=0.001,
                                max_draft_length=4, labels={"model": "bench"})
        peer.ask(f"scrape {prom.url}")
    else:
        obs = specobs.configure(enabled=False)
    w: dict[str, float] = {}
    cpu0 = time.process_time()
    n = worker(obs, seconds, w)
    if enabled:
        obs.force_flush(timeout_seconds=30)
    cpu = time.process_time() - cpu0
    out = {"cycles": n, "cpu_s": cpu, "worker_cpu_s": w["worker_cpu_s"]}
    if enabled:
        s = obs.snapshot()
        out.update({f"self_{k}": v for k, v in s.cpu_seconds.items()})
        out["cycles_counted"] = s.cycles_total
        obs.shutdown(timeout_seconds=10)
        spans, med = peer.ask("report").split()
        out["spans"] = int(spans)
        out["scrape_ms_median"] = float(med) * 1e3
    return out


def populated_observer() -> tuple[specobs.PrometheusSink, specobs.Observer]:
    """An observer on its own Prometheus endpoint with every series and label combination
    populated (every bucket, position, drop reason and error kind), as a worst-case scrape."""
    prom = specobs.PrometheusSink(port=0)
    obs = specobs.configure(sinks=[prom], clock="host", max_draft_length=8,
                            phases=["draft", "verify", "bookkeeping", "extend"],
                            labels={"model": "bench", "engine": "x"}, baseline_tokens_per_second=1)
    obs.set_requests(running=1, waiting=1)
    for i in range(2000):  # fill every bucket, position and reason
        c = obs.begin(1 + i % 1024)
        c.mark("verify")
        c.mark("bookkeeping")
        c.mark("extend")
        c.accept([i % 9], draft_length=8)
        c.end()
    obs.force_flush()
    # Worst case: every duration bucket of every phase and clock, every drop reason and error
    # kind non-zero, applied the way the resolver applies a chunk.
    from specobs import catalog
    from specobs._aggregation import Chunk
    from specobs._bucketing import bucket_py

    agg = obs.aggregation
    every_bucket = [round(b * 0.999e9) for b in catalog.DURATION_BUCKETS_SECONDS] + [10**10]
    one_each = bucket_py(every_bucket, catalog.DURATION_BUCKETS_SECONDS, 1e-9)
    agg.apply(Chunk(
        dropped=dict.fromkeys(catalog.DROP_REASONS, 1),
        errors=dict.fromkeys(catalog.ERROR_KINDS, 1),
        gpu_phases=[one_each] * len(agg.phases),
        gpu_cycle=one_each,
        acceptance=None,
        batch_sizes=None,
        traced=[],
    ))
    # The host clock's histograms come from the ring's totals, never a chunk: filled directly.
    for i in range(len(agg.phases)):
        agg.phase_host[i].add(one_each, 1e-9)
    agg.cycle_host.add(one_each, 1e-9)
    return prom, obs


def scrape_cost(repeats: int = 200) -> tuple[float, float, int]:
    """Collector-only and HTTP scrape time with every label combination populated."""
    from prometheus_client import generate_latest

    prom, obs = populated_observer()
    collect = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        body = generate_latest(prom.registry)
        collect.append(time.perf_counter() - t0)
    http = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        with urllib.request.urlopen(prom.url) as r:
            r.read()
        http.append(time.perf_counter() - t0)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    obs.shutdown()
    return statistics.median(collect) * 1e3, statistics.median(http) * 1e3, series


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
          f"{RATE} cycles/s for {args.seconds:.0f} s, {args.repeats} repeats (median)")
    peer = Peer()
    per_cycle = []
    per_thread = []
    last: dict[str, float] = {}
    try:
        for _ in range(args.repeats):
            off = run(args.seconds, False, peer)
            on = run(args.seconds, True, peer)
            per_cycle.append((on["cpu_s"] - off["cpu_s"]) / on["cycles"] * 1e6)
            # Per thread: the worker's own extra CPU (hot path) plus specobs's threads.
            own = sum(on.get(k, 0.0) for k in ("self_resolver", "self_prometheus", "self_otlp"))
            per_thread.append(
                (on["worker_cpu_s"] - off["worker_cpu_s"] + own) / on["cycles"] * 1e6
            )
            last = on
    finally:
        peer.stop()
    n = last["cycles"]
    print(f"{'measure':<62} {'value':>12}  target")
    print(f"{'specobs CPU per cycle, total (process CPU on - off)':<62} "
          f"{statistics.median(per_cycle):9.2f} us  <= 15 us   (runs: "
          + ", ".join(f"{v:.1f}" for v in per_cycle) + ")")
    print(f"{'specobs CPU per cycle, per thread (worker delta + own threads)':<62} "
          f"{statistics.median(per_thread):9.2f} us  <= 15 us   (runs: "
          + ", ".join(f"{v:.1f}" for v in per_thread) + ")")
    for key in ("self_resolver", "self_hot_path", "self_prometheus", "self_otlp"):
        if key in last:
            print(f"{'  of which ' + key[5:] + ' (self-metric), per cycle':<62} "
                  f"{last[key] / n * 1e6:9.2f} us")
    print(f"{'HTTP scrape during the run (median)':<62} {last['scrape_ms_median']:9.2f} ms")
    collect_ms, http_ms, series = scrape_cost()
    print(f"{f'/metrics collect, all labels populated ({series} series)':<62} "
          f"{collect_ms:9.2f} ms  <= 5 ms")
    print(f"{'/metrics HTTP round trip, same':<62} {http_ms:9.2f} ms  <= 5 ms")
    spans = max(1, int(last.get("spans", 0)))
    print(f"{'OTLP export CPU per exported span (' + str(spans) + ' spans)':<62} "
          f"{last.get('self_otlp', 0) / spans * 1e6:9.2f} us  (includes metric exports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
