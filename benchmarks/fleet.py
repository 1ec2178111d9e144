"""A simulated fleet against the real Prometheus, remote-writing to VictoriaMetrics, measured.

For each fleet size N (default 100, 300, 1000) one run of about nine minutes:

1. History: ``--backfill-hours`` (default 24) of every series the fleet dashboard and the alerts'
   history windows read (the ``instance:``/``cohort:`` recording series of every server, and
   ``specobs_info``, the history alerts' 5-minute averages) one sample per ``--backfill-step``
   (default 300 s: a 24 h history of 1,000 servers at 60 s
   would be 110 M samples, ~25 GB of text, too slow to load within a 10-minute run), and every
   series of the server the cycle-breakdown dashboard opens on (its raw series and its
   ``instance:`` rules) at the scrape interval, so none of its series mixes 5-minute and
   15-second samples; written as OpenMetrics and loaded with
   ``promtool tsdb create-blocks-from openmetrics`` into Prometheus and with
   ``/api/v1/import/prometheus`` into VictoriaMetrics.
2. ``specobs fleet-sim --servers N`` with faults; Debian ``prometheus`` scraping it every 15 s
   (file_sd), remote-writing the raw series to ``victoria-metrics`` (single node); ``vmalert``
   evaluating the same generated rules on VictoriaMetrics and writing the results back there.
3. Alerts (rule windows scaled for 15 s scrapes, :data:`MEDIUM_WINDOWS`): faults at 120 s;
   ``ALERTS`` of Prometheus and of vmalert scored against the simulator's events, each store
   against its own documented detection time (:func:`detection_bounds`; vmalert's is later by
   one evaluation and latency offset per link of the rule chain), the window kept open until the
   latest of them.
4. Sizing (the generated rules, default windows, reloaded): Prometheus RSS and CPU, head series,
   each rule group's evaluation time, remote-write lag; every fleet- and cycle-breakdown-dashboard
   query at 1 h, 6 h and 24 h on both stores (latency, Prometheus's peak samples, and whether
   VictoriaMetrics gives the same numbers).

``--stores prometheus``: what one Prometheus alone holds (the sizing question): the simulator
and Prometheus with the generated rules only; no remote write, no VictoriaMetrics, no vmalert.
The history goes into Prometheus only, the alerts are scored on Prometheus, the dashboard
queries run on Prometheus; the same sizing figures (each rule group's
``prometheus_rule_group_last_duration_seconds`` sampled every 5 s, median and max, idle and
under the dashboard queries; RSS, CPU, head series) without the other processes' load on the
cores.

Prints a table per N and writes JSON (``--json``). Loopback only; everything lives under
``--workdir`` (default /tmp/specobs-fleet-bench) and is deleted afterwards unless ``--keep``.

    python3 benchmarks/fleet.py --servers 100 300 1000
    python3 benchmarks/fleet.py --stores prometheus --servers 1000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specobs.mixin import MixinConfig, render_all
from specobs.mixin._config import duration_seconds
from specobs.mixin._panels import dashboard_queries, fill_variables
from specobs.mixin._rules import RuleNames, detection_seconds, history_rules
from specobs.tools.fleet._score import ALERT_MAP, firing_from_matrix, load_events, score
from specobs.tools.fleet._sim import MODELS, NAMESPACE, PHASES, Fleet

RULES_PATH = "deploy/prometheus/rules/specobs-rules.yml"
SCRAPE_SECONDS = 15
#: MixinConfig overrides for 15 s scrapes and runs of minutes.
MEDIUM_WINDOWS: dict[str, str] = {
    "rate_window": "1m", "history_window": "5m", "history_offset": "1m", "history_step": "30s",
    "cohort_for": "1m", "acceptance_drop_for": "1m", "throughput_drop_for": "2m",
    "slower_than_baseline_for": "2m", "phase_regression_for": "2m", "stall_after": "45s",
    "stall_for": "30s", "exporter_down_for": "1m", "target_missing_for": "5m",
    "dropped_records_for": "2m",
}
FAULT_AT = 120.0
#: VictoriaMetrics' ``-search.latencyOffset`` here: points younger than this are not returned.
VM_LATENCY_OFFSET = 5.0


def detection_bounds(config: MixinConfig) -> dict[str, dict[str, float]]:
    """Store -> alert -> the latest it may fire after a fault and still count as detected in
    time (docs/deploy.md, "Detection time"): Prometheus evaluates a chain of recording rules
    and the alert at one timestamp; vmalert sees each link's result one evaluation later, once
    written back to VictoriaMetrics and past its latency offset."""
    return {
        "prometheus": detection_seconds(config, SCRAPE_SECONDS, SCRAPE_SECONDS),
        "vmalert": detection_seconds(config, SCRAPE_SECONDS, SCRAPE_SECONDS,
                                     link_seconds=SCRAPE_SECONDS + VM_LATENCY_OFFSET),
    }


def alert_phase_seconds(config: MixinConfig) -> float:
    """Scoring window after the fault: the latest documented detection of any alert a fault
    expects, on either store, plus one evaluation."""
    expected = {name for must, _ in ALERT_MAP.values() for name in must}
    bounds = detection_bounds(config)
    return max(b[name] for b in bounds.values() for name in expected) + SCRAPE_SECONDS


SIZING_SECONDS = 260.0
#: Prometheus's own counters kept at every sizing sample (``timeline`` in the JSON).
TIMELINE_KEYS = ("process_cpu_seconds_total", "go_gc_duration_seconds_sum",
                 "go_gc_duration_seconds_count", "go_memstats_heap_alloc_bytes",
                 "prometheus_tsdb_compactions_total", "prometheus_tsdb_head_truncations_total",
                 "prometheus_tsdb_checkpoint_creations_total")
#: Seconds after the shipped rules are loaded that the dashboard queries start.
QUERY_AFTER = 150.0
RANGES = {"1h": 3600, "6h": 6 * 3600, "24h": 24 * 3600}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def faults_for(n: int) -> list[str]:
    """Faults in distinct cohorts (cohort = i % 16), none in the rolled-out model (i % 4 == 1)."""
    per = max(1, n // 100)
    stall = [3 + 16 * j for j in range(per) if 3 + 16 * j < n]
    down = [4 + 16 * j for j in range(per) if 4 + 16 * j < n]
    return [
        f"acceptance_collapse servers={','.join(str(i) for i in (0, 8) if i < n)} at={FAULT_AT:g}",
        f"verify_slowdown servers={','.join(str(i) for i in (2, 14) if i < n)} at={FAULT_AT:g}",
        f"stall servers={','.join(map(str, stall))} at={FAULT_AT:g}",
        f"exporter_down servers={','.join(map(str, down))} at={FAULT_AT:g}",
        f"bad_rollout model={MODELS[1].name} at={FAULT_AT:g}",
    ]


# -- backfill --------------------------------------------------------------------------------------

def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def backfill(fleet: Fleet, config: MixinConfig, end: float, hours: float, step: int,
             om_path: Path, vm_path: Path | None) -> int:
    """Write the history files (VictoriaMetrics' only where ``vm_path``); returns the number of
    samples."""
    n = RuleNames(config)
    rng = random.Random(1)
    start = int(end - hours * 3600)
    times = [start + i * step for i in range(int(hours * 3600 // step))]
    # The opened server: every series at the scrape interval, as Prometheus would have them.
    scrape_times = [start + i * SCRAPE_SECONDS for i in range(int(hours * 3600 // SCRAPE_SECONDS))]
    # The history alerts' averages, recorded every history_step by their own group.
    averaged = {r.expr.partition("(")[2].partition("[")[0]: r.record
                for r in history_rules(config)}
    every = int(duration_seconds(config.history_step))
    history_times = [start + i * every for i in range(int(hours * 3600 // every))]
    samples = 0
    opened = fleet.servers[0].instance
    to_vm = vm_path is not None
    with open(om_path, "w") as om, open(vm_path or os.devnull, "w") as vm:
        def series(name: str, labels: dict[str, str], value: float) -> None:
            nonlocal samples
            at = scrape_times if labels.get("instance") == opened else times
            write(name, labels, value, at)
            if name in averaged:
                write(averaged[name], labels, value, history_times)

        def write(name: str, labels: dict[str, str], value: float, at: list[int]) -> None:
            nonlocal samples
            head = f"{name}{{{_labels(labels)}}} "
            # The same +-1 % noise in both stores' copies.
            values = [f"{value * (1 + 0.02 * (rng.random() - 0.5)):.6g}" for _ in at]
            om.writelines(f"{head}{v} {t}\n" for v, t in zip(values, at, strict=True))
            if to_vm:
                vm.writelines(f"{head}{v} {t * 1000}\n" for v, t in zip(values, at, strict=True))
            samples += len(at)

        cohorts: dict[tuple[str, ...], list[Any]] = {}
        for s in fleet.servers:
            lab = {"cluster": s.cluster, "namespace": NAMESPACE, "job": "specobs",
                   "instance": s.instance, "pod": s.pod, "model_name": s.model.name,
                   "serving_engine": s.engine}
            cohort = (s.cluster, s.model.name, s.engine)
            cohorts.setdefault(cohort, []).append(s)
            cps = 1.0 / s.cycle_seconds
            seqs = cps * s.batch
            acc_mean = s.hists["accept"].mean
            drafted = seqs * s.model.draft_length
            accepted = seqs * acc_mean
            gpu_mean = {p: s.phase_gpu_seconds[p] for p in PHASES}
            host_mean = {p: g * 1.04 + 0.00003 for p, g in gpu_mean.items()}
            info = {**lab, "version": "fleet-sim", "phases": ",".join(PHASES),
                    "gpu_clock": "cuda_event", "sampling": "adaptive",
                    "integration": s.integration, "core": "native"}
            if s is not fleet.servers[0]:  # its raw series follow, specobs_info included
                series("specobs_info", info, 1)
            series(n.up, lab, 1)
            series(n.cycles, lab, cps)
            series(n.emitted, lab, accepted + seqs)
            series(n.drafted, lab, drafted)
            series(n.accepted, lab, accepted)
            series(n.acceptance, lab, accepted / drafted)
            series(n.batch_size_mean, lab, s.batch)
            series(n.emitted_per_sequence, lab, 1 + acc_mean)
            speed = (1 + acc_mean) / s.cycle_seconds
            series(n.sequence_speed, lab, speed)
            series(n.speedup_realized, {**lab, "source": "configured"},
                   speed * s.phase_gpu_seconds["verify"] * 1.04)
            series(n.last_cycle_age, lab, 7.5)
            series(n.alerts_firing, lab, 0)
            for clock, means in (("gpu", gpu_mean), ("host", host_mean)):
                total = sum(means.values())
                for p in PHASES:
                    series(n.phase_mean, {**lab, "phase": p, "clock": clock}, means[p])
                    series(n.phase_share, {**lab, "phase": p, "clock": clock}, means[p] / total)
            # Bucket rates and p99: the host clock only, as the rules record them.
            series(n.cycle_p99, {**lab, "clock": "host"}, sum(host_mean.values()) * 1.5)
            for le, rate in _bucket_rates(s.hists["cycle/host"], cps):
                series(n.cycle_bucket, {**lab, "clock": "host", "le": le}, rate)
        for (cluster, model, engine), members in cohorts.items():
            lab = {"cluster": cluster, "namespace": NAMESPACE, "job": "specobs",
                   "model_name": model, "serving_engine": engine}
            s = members[0]
            acc_mean = s.hists["accept"].mean
            series(n.cohort_servers, lab, len(members))
            series(n.cohort_acceptance, lab, acc_mean / s.model.draft_length)
            series(n.cohort_acceptance_median, lab, acc_mean / s.model.draft_length)
            series(n.cohort_speed_median, lab, (1 + acc_mean) / s.cycle_seconds)
            series(n.cohort_batch_median, lab, s.batch)
            for p in PHASES:
                for clock in ("gpu", "host"):
                    series(n.cohort_phase_median, {**lab, "phase": p, "clock": clock},
                           s.phase_gpu_seconds[p])
            cycle_rates: dict[str, float] = {}
            accept_rates: dict[str, float] = {}
            for m in members:
                cps = 1.0 / m.cycle_seconds
                for le, rate in _bucket_rates(m.hists["cycle/host"], cps):
                    cycle_rates[le] = cycle_rates.get(le, 0.0) + rate
                for le, rate in _bucket_rates(m.hists["accept"], cps * m.batch):
                    accept_rates[le] = accept_rates.get(le, 0.0) + rate
            for le, rate in cycle_rates.items():
                series(n.cohort_cycle_bucket, {**lab, "clock": "host", "le": le}, rate)
            for le, rate in accept_rates.items():
                series(n.cohort_accept_length_bucket, {**lab, "le": le}, rate)
        # The raw series of the server the cycle-breakdown dashboard opens on, as scraped.
        s0 = fleet.servers[0]
        lab0 = {"cluster": s0.cluster, "namespace": NAMESPACE, "job": "specobs",
                "instance": s0.instance, "pod": s0.pod}
        t_mono = 0.0
        s0.last_advance = 0.0
        for t in scrape_times:
            t_mono += SCRAPE_SECONDS
            s0.advance(float(t), t_mono)
            _, text = s0.render("")
            for line in text.decode().splitlines():
                if not line or line.startswith("#"):
                    continue
                name_labels, _, value = line.rpartition(" ")
                name, _, rest = name_labels.partition("{")
                rest = rest.rstrip("}")
                labels = _labels(lab0) + ("," + rest if rest else "")
                om.write(f"{name}{{{labels}}} {value} {t}\n")
                if to_vm:
                    vm.write(f"{name}{{{labels}}} {value} {t * 1000}\n")
                samples += 1
        om.write("# EOF\n")
    # OpenMetrics wants each series' samples contiguous; the raw block above is time-major,
    # which promtool accepts as long as timestamps per series increase.
    return samples


def _bucket_rates(h: Any, per_second: float) -> list[tuple[str, float]]:
    """(le, cumulative rate) of a simulated server's histogram at ``per_second`` observations."""
    out, acc = [], 0.0
    for le, f in zip((*h.bounds, math.inf), h.fractions, strict=True):
        acc += f
        out.append(("+Inf" if le == math.inf else repr(le), acc * per_second))
    return out


# -- processes -------------------------------------------------------------------------------------

class Procs:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as f:
            p = subprocess.Popen(argv, stdout=f, stderr=f, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        self.procs.append(p)
        return p

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.procs.clear()


def wait_http(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout}s")


def self_metrics(url: str) -> dict[str, float]:
    """Selected series of a Prometheus-format /metrics page, summed per name{filtered}."""
    out: dict[str, float] = {}
    for line in httpx.get(url, timeout=10).text.splitlines():
        if line.startswith("#") or not line:
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            pass
    return out


def api(base: str, path: str, params: dict[str, Any], timeout: float = 120.0
        ) -> tuple[float, dict[str, Any]]:
    t = time.perf_counter()
    r = httpx.get(base + path, params=params, timeout=timeout)
    elapsed = time.perf_counter() - t
    try:
        body = r.json()
    except ValueError:
        body = {"status": "error", "error": r.text[:300]}
    return elapsed, body


def _values(result: list[dict[str, Any]]) -> dict[tuple[str, float], float]:
    """(series, timestamp) -> value, for instant and range results alike."""
    out = {}
    for s in result:
        key = json.dumps({k: v for k, v in s["metric"].items() if k != "__name__"},
                         sort_keys=True)
        for t, v in s.get("values") or [s["value"]]:
            out[(key, round(float(t)))] = float(v)
    return out


def compare(a: dict[tuple[str, float], float], b: dict[tuple[str, float], float],
            split: float, live_from: float
            ) -> tuple[float | None, float | None, float | None]:
    """Relative differences between two results at the (series, time) points both have: the
    largest before ``split`` (the backfilled history, the same samples in both stores), and the
    largest and the median from ``live_from`` on (live data whose whole window both stores hold
    and, for recording rules, both rulers have evaluated with the shipped rules). Points between
    the two (the seam: gaps, the backfill's 5-minute samples inside a rate window, the rulers
    switching rule files) are not compared. None where no point is common."""
    hist: list[float] = []
    live: list[float] = []
    for k in set(a) & set(b):
        if split <= k[1] < live_from:
            continue
        x, y = a[k], b[k]
        if math.isnan(x) and math.isnan(y):
            continue
        d = abs(x - y) / max(abs(x), abs(y), 1e-12)
        (hist if k[1] < split else live).append(d)
    live.sort()
    return (max(hist) if hist else None, max(live) if live else None,
            live[len(live) // 2] if live else None)


_RULE_SERIES = re.compile(r"\b(instance|cohort|host):[a-z_]+:")

#: Like-for-like probes, instant queries at one timestamp on both stores: the same raw samples
#: (should agree exactly), the two rate() implementations over them, and each store's own ruler.
VM_PROBES: dict[str, str] = {
    "raw counter": 'sum(specobs_cycles_total{job="specobs"})',
    "raw gauge": 'sum(specobs_last_cycle_timestamp_seconds{job="specobs"})',
    "rate() over raw, 5m": 'sum(rate(specobs_cycles_total{job="specobs"}[5m]))',
    "rate() over raw, 1m": 'sum(rate(specobs_cycles_total{job="specobs"}[1m]))',
    # Series that restarted (counter reset) or began (a rollout's new pod) inside the window
    # left out: the two rate() implementations treat those edges differently.
    "rate() over raw, 5m, no reset or start in the window":
        'sum(rate(specobs_cycles_total{job="specobs"}[5m])'
        ' and on (instance) (resets(specobs_cycles_total{job="specobs"}[5m]) == 0)'
        ' and on (instance) (count_over_time(specobs_cycles_total{job="specobs"}[5m]) >= 19))',
    "per-server rate() over raw, 5m (median of servers)":
        'quantile(0.5, rate(specobs_cycles_total{job="specobs"}[5m]))',
    "recording rule, each store's ruler": 'sum(instance:specobs_cycles:rate5m{job="specobs"})',
    "recording rule ratio, each store's ruler":
        'avg(instance:specobs_acceptance:ratio_rate5m{job="specobs"})',
}


# -- one run ---------------------------------------------------------------------------------------

def run_one(n: int, args: argparse.Namespace) -> dict[str, Any]:
    wd = args.workdir / f"n{n}"
    shutil.rmtree(wd, ignore_errors=True)
    wd.mkdir(parents=True)
    procs = Procs()
    alone = args.stores == "prometheus"  # one Prometheus, nothing else
    result: dict[str, Any] = {"servers": n, "stores": args.stores}
    default = MixinConfig()
    medium = MixinConfig(**MEDIUM_WINDOWS)  # type: ignore[arg-type]
    default_files = render_all(default)
    rules = wd / "rules.yml"
    rules.write_text(render_all(medium)[RULES_PATH])
    try:
        # 1. history
        t = time.perf_counter()
        fleet_params = Fleet(n, [], seed=args.seed)
        now = time.time()
        history_end = now - 600
        samples = backfill(fleet_params, default, history_end, args.backfill_hours,
                           args.backfill_step, wd / "history.om",
                           None if alone else wd / "history.vm")
        result["backfill_samples"] = samples
        gen_s = time.perf_counter() - t
        t = time.perf_counter()
        block_hours = max(2, 2 * math.ceil(args.backfill_hours / 2))  # one pass, not one per 2 h
        cp = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                             f"--max-block-duration={block_hours}h",
                             str(wd / "history.om"), str(wd / "data")], capture_output=True,
                            text=True)
        if cp.returncode != 0:
            raise RuntimeError(f"promtool backfill failed: {cp.stderr[-2000:]}")
        (wd / "history.om").unlink()
        promtool_s = time.perf_counter() - t
        vm_port, prom_port, vmalert_port, sim_port = (free_port() for _ in range(4))
        vm = f"http://127.0.0.1:{vm_port}"
        result["backfill_seconds"] = {"generate": round(gen_s, 1),
                                      "promtool": round(promtool_s, 1)}
        if not alone:
            procs.start(["victoria-metrics", f"-storageDataPath={wd / 'vm'}",
                         f"-httpListenAddr=127.0.0.1:{vm_port}", "-retentionPeriod=2",
                         "-search.latencyOffset=5s"], wd / "vm.log")
            wait_http(vm + "/health")
            t = time.perf_counter()
            with open(wd / "history.vm", "rb") as f:
                r = httpx.post(vm + "/api/v1/import/prometheus", content=f, timeout=600)
                r.raise_for_status()
            httpx.get(vm + "/internal/force_flush", timeout=60)
            (wd / "history.vm").unlink()
            result["backfill_seconds"]["vm_import"] = round(time.perf_counter() - t, 1)
        print(f"[n={n}] backfill: {samples / 1e6:.1f} M samples; {result['backfill_seconds']}",
              flush=True)

        # 2. the fleet, Prometheus, vmalert
        targets, events = wd / "targets.json", wd / "events.jsonl"
        sim_argv = [sys.executable, "-c",
                    "import sys; from specobs.cli import main; sys.exit(main(sys.argv[1:]))",
                    "fleet-sim", "--servers", str(n), "--port", str(sim_port),
                    "--targets-file", str(targets), "--events-file", str(events),
                    "--seed", str(args.seed)]
        for fault in faults_for(n):
            sim_argv += ["--fault", fault]
        sim = procs.start(sim_argv, wd / "sim.log")
        t0 = time.time()
        deadline = time.monotonic() + 30
        while not targets.exists():
            if time.monotonic() > deadline or sim.poll() is not None:
                raise RuntimeError("fleet-sim did not start: " + (wd / "sim.log").read_text())
            time.sleep(0.2)
        drop_rules = "(instance|cohort|host):.*|ALERTS|ALERTS_FOR_STATE"
        prom_config = {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s",
                       "scrape_timeout": "10s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "specobs",
                                "file_sd_configs": [{"files": [str(targets)],
                                                     "refresh_interval": "10s"}]}],
        }
        if not alone:
            # Raw series only: the store evaluates the rules itself (vmalert).
            prom_config["remote_write"] = [{"url": vm + "/api/v1/write",
                                            "write_relabel_configs": [
                                                {"source_labels": ["__name__"],
                                                 "regex": drop_rules, "action": "drop"}]}]
        (wd / "prometheus.yml").write_text(json.dumps(prom_config, indent=1))
        prom_proc = procs.start(["prometheus", f"--config.file={wd / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={wd / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}",
                                 "--web.enable-lifecycle", "--storage.tsdb.retention.time=30d"],
                                wd / "prometheus.log")
        prom = f"http://127.0.0.1:{prom_port}"
        wait_http(prom + "/-/ready")
        vmalert = f"http://127.0.0.1:{vmalert_port}"
        if not alone:
            procs.start(["vmalert", f"-rule={rules}", f"-datasource.url={vm}",
                         f"-remoteWrite.url={vm}", f"-remoteRead.url={vm}",
                         "-notifier.url=http://127.0.0.1:1",
                         f"-evaluationInterval={SCRAPE_SECONDS}s",
                         f"-httpListenAddr=127.0.0.1:{vmalert_port}"], wd / "vmalert.log")
        # The stores whose rulers and queries are measured.
        stores = {"prometheus": prom} if alone else {"prometheus": prom, "vmalert": vm}

        # 3. alerts
        bounds = detection_bounds(medium)
        while time.time() < t0 + FAULT_AT + alert_phase_seconds(medium):
            time.sleep(5)
        end = time.time()
        fault_events = load_events(events)
        alerts: dict[str, Any] = {}
        for store, base in stores.items():
            _, body = api(base, "/api/v1/query_range",
                          {"query": 'ALERTS{alertstate="firing"}', "start": t0, "end": end,
                           "step": SCRAPE_SECONDS})
            matrix = body.get("data", {}).get("result", [])
            scores = score(firing_from_matrix(matrix), fault_events)
            alerts[store] = {
                name: {"precision": s.precision, "recall": s.recall,
                       "tp": s.true_positives, "fp": s.false_positives,
                       "expected": s.expected, "detected": s.detected,
                       "bound_seconds": bounds[store].get(name),
                       "detected_in_time": sum(1 for d in s.delays_seconds
                                               if d <= bounds[store].get(name, math.inf)),
                       "seconds_to_fire": [round(d) for d in s.delays_seconds],
                       "false": s.false[:5]}
                for name, s in sorted(scores.items())}
        result["alerts"] = alerts

        # 4. sizing: the generated rules as shipped
        rules.write_text(default_files[RULES_PATH])
        httpx.post(prom + "/-/reload", timeout=30).raise_for_status()
        if not alone:
            try:
                httpx.post(vmalert + "/-/reload", timeout=30)
            except httpx.HTTPError:
                pass
        sizing_start = time.time()
        samples_taken: list[dict[str, float]] = []
        timeline: list[dict[str, Any]] = []
        pid_stat = Path(f"/proc/{prom_proc.pid}/stat")
        tick = os.sysconf("SC_CLK_TCK")

        def cpu_seconds() -> float:
            fields = pid_stat.read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick

        cpu0, wall0 = cpu_seconds(), time.monotonic()
        group_max: dict[str, float] = {}
        group_all: dict[str, list[float]] = {}
        group_idle: dict[str, list[float]] = {}
        querying = False
        vmalert_max: dict[str, float] = {}
        rss_max = head_max = lag_max = 0.0
        # Rule -> {lastEvaluation: evaluationTime}: every evaluation of every rule while idle
        # (--stores prometheus only).
        rule_times: dict[str, dict[str, float]] = {}

        def sample_rules() -> None:
            _, body = api(prom, "/api/v1/rules", {})
            for g in body.get("data", {}).get("groups", []):
                for r in g["rules"]:
                    rule_times.setdefault(f"{g['name']}/{r['name']}", {})[
                        r.get("lastEvaluation", "")] = r.get("evaluationTime", 0.0)

        def sample() -> None:
            nonlocal rss_max, head_max, lag_max
            m = self_metrics(prom + "/metrics")
            samples_taken.append(m)
            # What a slow evaluation coincides with: Go GC, head compaction, CPU.
            timeline.append({
                "t": round(time.time() - sizing_start, 1), "querying": querying,
                "groups_ms": {_group_name(k): round(v * 1000, 1) for k, v in m.items()
                              if k.startswith("prometheus_rule_group_last_duration_seconds{")},
                **{key: m.get(key) for key in TIMELINE_KEYS}})
            rss_max = max(rss_max, m.get("process_resident_memory_bytes", 0))
            if alone and not querying and time.time() - sizing_start > 2 * SCRAPE_SECONDS + 5:
                sample_rules()
            head_max = max(head_max, m.get("prometheus_tsdb_head_series", 0))
            highest = sent = None
            for k, v in m.items():
                if k.startswith("prometheus_rule_group_last_duration_seconds{"):
                    if time.time() - sizing_start > 2 * SCRAPE_SECONDS + 5:
                        group_max[k] = max(group_max.get(k, 0), v)
                        group_all.setdefault(k, []).append(v)
                        if not querying:
                            group_idle.setdefault(k, []).append(v)
                if k.startswith("prometheus_remote_storage_highest_timestamp_in_seconds"):
                    highest = v
                if k.startswith("prometheus_remote_storage_queue_highest_sent_timestamp_seconds"):
                    sent = v
            if highest is not None and sent is not None:
                lag_max = max(lag_max, highest - sent)
            if alone:
                return
            try:
                vm_m = self_metrics(vmalert + "/metrics")
            except httpx.HTTPError:
                return
            for k, v in vm_m.items():
                if k.startswith("vmalert_iteration_duration_seconds{") and 'quantile="0.99"' in k:
                    vmalert_max[k] = max(vmalert_max.get(k, 0), v)

        queries: list[dict[str, Any]] = []
        dashboards = {name: json.loads(default_files[f"dashboards/{name}.json"])
                      for name in ("fleet", "cycle-breakdown")}
        s0 = fleet_params.servers[0]
        opened_on = {"cluster": s0.cluster, "namespace": NAMESPACE, "job": "specobs",
                     "model": s0.model.name, "instance": s0.instance}
        # Long enough that both rulers have evaluated the shipped rules for a minute before the
        # query timestamp below, so live recording-rule points compare like for like.
        while time.time() < sizing_start + QUERY_AFTER:
            sample()
            time.sleep(5)
        # queries while rules keep running (and keep sampling between them)
        # The slowest rules of the last evaluation before the dashboard queries start.
        _, rules_body = api(prom, "/api/v1/rules", {})
        result["slowest_rules_idle_ms"] = sorted(
            ((r["name"], round(r["evaluationTime"] * 1000, 1))
             for g in rules_body["data"]["groups"] for r in g["rules"]),
            key=lambda x: -x[1])[:12]
        result["rule_groups_last_ms"] = {
            g["name"]: round(g["evaluationTime"] * 1000, 1) for g in rules_body["data"]["groups"]}
        querying = True
        # On a 60 s grid, so both stores put their range points at the same timestamps.
        qt = math.floor((time.time() - 30) / 60) * 60
        last_sample = time.monotonic()
        for dname, dash in dashboards.items():
            values = None if dname == "fleet" else opened_on
            for title, expr in dashboard_queries(dash):
                instant = _is_instant(dash, title)
                for rname, seconds in (({"instant": 0}) if instant else RANGES).items():
                    step = max(SCRAPE_SECONDS, round(seconds / 1500 / 15) * 15)
                    rate_iv = f"{max(4 * SCRAPE_SECONDS, step + SCRAPE_SECONDS)}s"
                    q = fill_variables(expr, rate_iv, values)
                    kind = "rules" if _RULE_SERIES.search(q) else "raw"
                    row: dict[str, Any] = {"dashboard": dname, "panel": title, "range": rname,
                                           "kind": kind}
                    # Live points whose whole rate window is live data, and (rules) that both
                    # rulers evaluated with the shipped rules for a few evaluations.
                    live_from = (sizing_start + 3 * SCRAPE_SECONDS if kind == "rules"
                                 else t0 + int(rate_iv.rstrip("s")) + 2 * SCRAPE_SECONDS)
                    for store, base in ((("prometheus", prom),) if alone
                                        else (("prometheus", prom), ("vm", vm))):
                        if instant:
                            params: dict[str, Any] = {"query": q, "time": qt}
                            path = "/api/v1/query"
                        else:
                            params = {"query": q, "start": qt - seconds, "end": qt, "step": step}
                            path = "/api/v1/query_range"
                        if store == "prometheus":
                            params["stats"] = "all"
                        elapsed, body = api(base, path, params)
                        row[f"{store}_seconds"] = round(elapsed, 3)
                        row[f"{store}_status"] = body.get("status")
                        if body.get("status") != "success":
                            row[f"{store}_error"] = str(body.get("error"))[:200]
                            continue
                        data = body["data"]
                        row[f"{store}_series"] = len(data["result"])
                        if store == "prometheus":
                            st = data.get("stats", {}).get("samples", {})
                            row["peak_samples"] = st.get("peakSamples")
                            row["total_samples"] = st.get("totalQueryableSamples")
                        row[f"{store}_values"] = _values(data["result"])
                    if "prometheus_values" in row and "vm_values" in row:
                        hist, live, live_median = compare(row.pop("prometheus_values"),
                                                          row.pop("vm_values"), history_end,
                                                          live_from)
                        row["vm_diff_history"], row["vm_diff_live"] = hist, live
                        row["vm_diff_live_median"] = live_median
                    row.pop("prometheus_values", None)
                    row.pop("vm_values", None)
                    queries.append(row)
                    if time.monotonic() - last_sample > 5:
                        sample()
                        last_sample = time.monotonic()
        probes = {}
        pt = math.floor((time.time() - 30) / 15) * 15
        for name, expr in ({} if alone else VM_PROBES).items():
            got = {}
            for store, base in (("prometheus", prom), ("vm", vm)):
                _, body = api(base, "/api/v1/query", {"query": expr, "time": pt})
                res = body.get("data", {}).get("result", [])
                got[store] = float(res[0]["value"][1]) if res else None
            x, y = got["prometheus"], got["vm"]
            diff = (abs(x - y) / max(abs(x), abs(y), 1e-12)
                    if x is not None and y is not None else None)
            probes[name] = {"query": expr, **got, "diff": diff}
        if probes:
            result["vm_probes"] = probes
        while time.time() < sizing_start + SIZING_SECONDS:
            sample()
            time.sleep(5)
        cpu1, wall1 = cpu_seconds(), time.monotonic()
        result["prometheus"] = {
            "rss_max_mib": round(rss_max / 2**20),
            "cpu_cores_mean": round((cpu1 - cpu0) / (wall1 - wall0), 3),
            "head_series_max": int(head_max),
            "rule_group_last_duration_max_seconds": {k: round(v, 4) for k, v in group_max.items()},
            "rule_group_last_duration_idle_max_seconds": {
                k: round(max(v), 4) for k, v in group_idle.items()},
            "rule_group_last_duration_median_seconds": {
                k: round(sorted(v)[len(v) // 2], 4) for k, v in group_all.items()},
            "remote_write_lag_max_seconds": None if alone else round(lag_max, 1),
        }
        result["rule_eval_ms_idle"] = {
            name: {"median": round(sorted(v)[len(v) // 2] * 1000, 1),
                   "max": round(max(v) * 1000, 1), "evaluations": len(v)}
            for name, by_time in rule_times.items() if (v := list(by_time.values()))}
        result["vmalert_iteration_p99_max_seconds"] = {k: round(v, 4)
                                                       for k, v in vmalert_max.items()}
        result["queries"] = queries
        result["timeline"] = timeline
        sim_log = (wd / "sim.log").read_text()
        result["sim_log_tail"] = sim_log[-400:]
    finally:
        procs.stop_all()
        if not args.keep:
            shutil.rmtree(wd, ignore_errors=True)
    return result


def _is_instant(dash: dict[str, Any], title: str) -> bool:
    name, _, ref = title.rpartition(" [")
    ref = ref.rstrip("]")

    def walk(panels: list[dict[str, Any]]) -> bool | None:
        for p in panels:
            found = walk(p.get("panels", []))
            if found is not None:
                return found
            if p.get("title") == name:
                for i, t in enumerate(p.get("targets", [])):
                    if str(t.get("refId", i)) == ref:
                        return bool(t.get("instant"))
        return None

    return bool(walk(dash.get("panels", [])))


def report(r: dict[str, Any]) -> None:
    n = r["servers"]
    p = r["prometheus"]
    print(f"\n== {n} servers ==")
    print(f"prometheus ({r.get('stores', 'all')}): RSS max {p['rss_max_mib']} MiB, CPU "
          f"{p['cpu_cores_mean']} cores, head series {p['head_series_max']}, remote-write lag "
          f"max {p['remote_write_lag_max_seconds']} s")
    medians = p.get("rule_group_last_duration_median_seconds", {})
    for k, v in p["rule_group_last_duration_max_seconds"].items():
        print(f"  rule group {_group_name(k)}: median {medians.get(k, 0) * 1000:.1f} ms, max "
              f"last duration {v * 1000:.1f} ms")
    for name, t in sorted(r.get("rule_eval_ms_idle", {}).items(),
                          key=lambda x: -x[1]["median"])[:12]:
        print(f"  rule {name}: median {t['median']} ms, max {t['max']} ms "
              f"({t['evaluations']} evaluations, idle)")
    for k, v in r["vmalert_iteration_p99_max_seconds"].items():
        print(f"  vmalert {k}: p99 iteration {v * 1000:.1f} ms")
    print("queries (dashboard, panel, range: prometheus s / peak samples | vm s | VM vs "
          "Prometheus, largest difference: history / live):")
    for q in r["queries"]:
        print(f"  {q['dashboard']:<15} {q['panel'][:48]:<48} {q['range']:>7}: "
              f"{q.get('prometheus_seconds')} s / {q.get('peak_samples')} | "
              f"{q.get('vm_seconds')} s | {_pct(q.get('vm_diff_history'))} / "
              f"{_pct(q.get('vm_diff_live'))}"
              + (f" PROM ERR {q['prometheus_error']}" if "prometheus_error" in q else "")
              + (f" VM ERR {q['vm_error']}" if "vm_error" in q else ""))
    for name, pr in r.get("vm_probes", {}).items():
        print(f"  probe {name}: prometheus {pr['prometheus']} vm {pr['vm']} diff "
              f"{_pct(pr['diff'])}")
    for store, scores in r["alerts"].items():
        print(f"alerts ({store}):")
        for name, s in scores.items():
            print(f"  {name:<40} precision {s['precision']} recall {s['recall']} "
                  f"(tp {s['tp']}, fp {s['fp']}, expected {s['expected']}, detected "
                  f"{s['detected']}) seconds to fire {s['seconds_to_fire']}"
                  + (f" false: {s['false'][:2]}" if s["false"] else ""))


def markdown(results: list[dict[str, Any]]) -> str:
    """The summary tables of benchmarks/RESULTS.md and docs/deploy.md#sizing."""
    lines = ["| servers | head series | Prometheus RSS (max) | Prometheus CPU (cores) | rule group "
             "evaluation: max idle / median / max under dashboard queries | vmalert group (p99) | "
             "remote-write lag (max) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        p = r["prometheus"]
        group = max(p["rule_group_last_duration_max_seconds"].values(), default=0)
        vma = max(r["vmalert_iteration_p99_max_seconds"].values(), default=None)
        lag = p["remote_write_lag_max_seconds"]
        med = max(p.get("rule_group_last_duration_median_seconds", {}).values(), default=0)
        idle = max(p.get("rule_group_last_duration_idle_max_seconds", {}).values(), default=0)
        lines.append(f"| {r['servers']:,} | {p['head_series_max']:,} | {p['rss_max_mib']:,} MiB | "
                     f"{p['cpu_cores_mean']:.2f} | {idle * 1000:.0f} / {med * 1000:.0f} / "
                     f"{group * 1000:.0f} ms | "
                     f"{'-' if vma is None else f'{vma * 1000:.0f} ms'} | "
                     f"{'-' if lag is None else f'{lag:.0f} s'} |")
    lines += ["", "| servers | rule group | Prometheus: median / max idle / max under dashboard "
              "queries | vmalert (p99, max) |", "| ---: | --- | ---: | ---: |"]
    for r in results:
        p = r["prometheus"]
        medians = p.get("rule_group_last_duration_median_seconds", {})
        for key, top in p["rule_group_last_duration_max_seconds"].items():
            name = _group_name(key)
            idle = p.get("rule_group_last_duration_idle_max_seconds", {}).get(key, 0)
            vma = next((v for k, v in r["vmalert_iteration_p99_max_seconds"].items()
                        if f'group="{name}"' in k), None)
            lines.append(f"| {r['servers']:,} | `{name}` | {medians.get(key, 0) * 1000:.0f} / "
                         f"{idle * 1000:.0f} / {top * 1000:.0f} ms | "
                         f"{'-' if vma is None else f'{vma * 1000:.0f} ms'} |")
        slow = r.get("slowest_rules_idle_ms", [])
        if slow:
            lines.append(f"| {r['servers']:,} | slowest rules (last evaluation before the "
                         "queries) | " + ", ".join(f"`{n}` {ms:g} ms" for n, ms in slow[:6])
                         + " | |")
    lines += ["", "| servers | dashboard | range | slowest query, Prometheus | slowest, "
              "VictoriaMetrics | peak samples (max, Prometheus) | VM vs Prometheus: history "
              "(max) | live, raw-series queries: median of the worst query (max) | live, "
              "recording-rule queries: the same |",
              "| ---: | --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in results:
        for dash in ("fleet", "cycle-breakdown"):
            for rng in ("instant", *RANGES):
                qs = [q for q in r["queries"] if q["dashboard"] == dash and q["range"] == rng]
                if not qs:
                    continue
                slow = max(qs, key=lambda q: q.get("prometheus_seconds") or 0)
                slow_vm = max(qs, key=lambda q: q.get("vm_seconds") or 0).get("vm_seconds")
                peak = max((q.get("peak_samples") or 0) for q in qs)
                hist = max((q["vm_diff_history"] for q in qs
                            if q.get("vm_diff_history") is not None), default=None)
                live = {}
                for kind in ("raw", "rules"):
                    ks = [q for q in qs if q.get("kind", "rules") == kind]
                    worst = max((q["vm_diff_live"] for q in ks
                                 if q.get("vm_diff_live") is not None), default=None)
                    med = max((q["vm_diff_live_median"] for q in ks
                               if q.get("vm_diff_live_median") is not None), default=None)
                    live[kind] = f"{_pct(med)} ({_pct(worst)})" if ks else "n/a"
                errors = sum(1 for q in qs if "prometheus_error" in q or "vm_error" in q)
                lines.append(
                    f"| {r['servers']:,} | {dash} ({len(qs)} queries) | {rng} | "
                    f"{slow['prometheus_seconds']:.3f} s ({slow['panel']}) | "
                    f"{'-' if slow_vm is None else f'{slow_vm:.3f} s'} | {peak:,} | {_pct(hist)} | "
                    f"{live['raw']} | {live['rules']}"
                    + (f" ({errors} errors)" if errors else "") + " |")
    if any("vm_probes" in r for r in results):
        lines += ["", "| servers | like-for-like probe (instant, same timestamp) | Prometheus | "
                  "VictoriaMetrics | difference |", "| ---: | --- | ---: | ---: | ---: |"]
        for r in results:
            for name, pr in r.get("vm_probes", {}).items():
                lines.append(f"| {r['servers']:,} | {name}: `{pr['query']}` | "
                             f"{_num(pr['prometheus'])} | {_num(pr['vm'])} | "
                             f"{_pct(pr['diff'])} |")
    lines += ["", "| servers | store | alert | precision | recall | seconds to fire | "
              "documented detection time | recall within it |",
              "| ---: | --- | --- | ---: | ---: | --- | ---: | ---: |"]
    for r in results:
        for store, scores in r["alerts"].items():
            for name, sc in scores.items():
                prec = "-" if sc["precision"] is None else f"{sc['precision']:.2f}"
                rec = "-" if sc["recall"] is None else f"{sc['recall']:.2f}"
                delays = sc["seconds_to_fire"]
                fire = (f"{min(delays)}-{max(delays)} ({len(delays)} of {sc['expected']})"
                        if delays else "-")
                bound = sc.get("bound_seconds")
                in_time = ("-" if not sc["expected"] or "detected_in_time" not in sc
                           else f"{sc['detected_in_time'] / sc['expected']:.2f}")
                lines.append(f"| {r['servers']:,} | {store} | {name} | {prec} ({sc['tp']} tp, "
                             f"{sc['fp']} fp) | {rec} | {fire} | "
                             f"{'-' if bound is None else f'{bound:g} s'} | {in_time} |")
    return "\n".join(lines) + "\n"


def _group_name(key: str) -> str:
    """The group of a ``prometheus_rule_group_*{rule_group="<file>;<name>"}`` series."""
    match = re.search(r'rule_group="[^"]*;([^"]+)"', key)
    return match.group(1) if match else key


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2%}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--backfill-hours", type=float, default=24.0)
    parser.add_argument("--backfill-step", type=int, default=300)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/specobs-fleet-bench"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stores", choices=("all", "prometheus"), default="all",
                        help="all: Prometheus remote-writing to VictoriaMetrics with vmalert "
                        "(default); prometheus: one Prometheus alone (no remote write, no "
                        "VictoriaMetrics, no vmalert)")
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--markdown", type=Path, nargs="+", default=None, metavar="JSON",
                        help="only print the Markdown tables of earlier --json results")
    args = parser.parse_args()
    if args.markdown:
        print(markdown([r for path in args.markdown for r in json.loads(path.read_text())]))
        return 0
    results = []
    for n in args.servers:
        r = run_one(n, args)
        report(r)
        results.append(r)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
