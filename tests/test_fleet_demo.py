"""The generated dashboards, rules and ``specobs doctor`` against ONE real ``specobs demo`` (CPU,
cached weights, its own baseline measured while serving) scraped by ONE real Prometheus 2.42
loaded with the committed rule file.

The module fixture runs everything once, in order: start Prometheus and the demo; once the
demo cycles, its measured baseline is scraped, the 5m recording rules have a value and every rule
group has run since, run ``specobs doctor`` on the live endpoint and evaluate every query of both
generated dashboards (and their template variables) at that moment; then, once the demo has
served at least 45 s, stop it (SIGTERM, as cleanly as Ctrl-C) and read its own final summary. On
a busy machine the warm-up takes longer, so the demo runs until stopped instead of for a fixed
time that could end before the doctor ran. The tests assert on what was recorded:

- every dashboard query returns a finite number for the healthy server; the only empty ones are
  GPU-clock-only panels (a CPU has no GPU clock), which say "No GPU-timed cycles";
- the dashboards' model variable finds the demo (``model_name``);
- the realized-speedup rule and panel agree with the demo's own figure within 15 %;
- ``specobs doctor`` passes, its baseline check on the demo's measured baseline.

About 70 s of wall time on 2 cores: a 45 s demo, start-up and shutdown.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from specobs.mixin._dashboards import NO_ENGINE_METRICS
from tests._prometheus_server import PrometheusServer, free_port, prometheus_path

#: Whichever test runs first pays for the module fixture, whose waits are all conditions with
#: deadlines: up to 240 s for the realized-speedup rule, 60 s for a round of rule groups, 60 s of
#: doctor, 165 s for 45 s of serving and 90 s for the demo's exit, about 10 minutes in all on a
#: loaded machine; at load 17 the module took 303 s, over the suite's 300 s default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy/prometheus/rules/specobs-rules.yml"
DASHBOARDS = ("dashboards/cycle-breakdown.json", "dashboards/fleet.json")
#: The demo serves at least this long (seconds of cycles in Prometheus) before it is stopped,
#: so the whole-run figures the speedup comparison reads average many cycles.
DEMO_SECONDS = 45
#: A bound only: the fixture stops the demo once it has what the tests need.
DEMO_MAX_SECONDS = 900
#: What Grafana's $__rate_interval is at a 1 s scrape and a short range; the speedup comparison
#: uses the whole run instead.
RATE_INTERVAL = "15s"
NO_GPU_CLOCK = "No GPU-timed cycles"
REALIZED = "instance:specobs_speedup:realized_rate5m"


@dataclass
class Run:
    target: str
    log: Path
    doctor_code: int = -1
    doctor: dict[str, Any] = field(default_factory=dict)
    variables: dict[str, list[str]] = field(default_factory=dict)
    #: (dashboard, panel title, refId, expr, noValue) -> the instant query's values
    panels: dict[tuple[str, str, str, str, str], list[float]] = field(default_factory=dict)
    final_text: str = ""
    rule_speedup: float | None = None
    panel_speedup: float | None = None
    rule_source: str | None = None
    baseline: float | None = None


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECOBS_", "OTEL_"))}
    env["SPECOBS_CACHE_DIR"] = os.environ["SPECOBS_CACHE_DIR"]
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _substitute(expr: str, target: str, model: str, rate: str = RATE_INTERVAL) -> str:
    """What Grafana sends for the dashboards' variables, with one server selected."""
    out = expr.replace("$__rate_interval", rate)
    for name, value in (("cluster", ".*"), ("namespace", ".*"), ("job", "specobs"),
                        ("model", model), ("serving_engine", ".*"), ("instance", target)):
        out = out.replace(f"${name}", value)
    assert "$" not in out.replace("$1", ""), out
    return out


def _values(result: list[dict[str, Any]]) -> list[float]:
    return [float(r["value"][1]) for r in result]


def _dashboard_targets(path: str) -> Iterator[tuple[str, str, str, str]]:
    data = json.loads((ROOT / path).read_text())
    for panel in data["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            if inner.get("type") == "row":
                continue
            no_value = inner.get("fieldConfig", {}).get("defaults", {}).get("noValue", "")
            for t in inner.get("targets", []):
                yield inner["title"], t["refId"], t["expr"], no_value


def _variable_queries(path: str) -> Iterator[tuple[str, str, str]]:
    """(name, metric selector, label) of each ``label_values(selector, label)`` variable."""
    data = json.loads((ROOT / path).read_text())
    for v in data["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", v.get("query") or "")
        if v.get("type") == "query" and m:
            yield v["name"], m.group(1), m.group(2)


def _last_up(server: PrometheusServer, target: str, since: float) -> float:
    """The time of the last successful scrape of ``target``."""
    result = server.query_range(f'up{{instance="{target}"}} == 1', since, time.time(), 0.5)
    assert result, "the demo was never scraped"
    return float(result[0]["values"][-1][0])


def _wait_served(server: PrometheusServer, target: str, since: float, seconds: float,
                 timeout_seconds: float) -> None:
    """Wait until Prometheus holds ``seconds`` of the demo cycling (first to last scrape with
    cycles)."""
    deadline = time.monotonic() + timeout_seconds
    served = 0.0
    while time.monotonic() < deadline:
        result = server.query_range(
            f'specobs_cycles_total{{instance="{target}"}} > 0', since, time.time(), 0.5)
        if result:
            values = result[0]["values"]
            served = float(values[-1][0]) - float(values[0][0])
            if served >= seconds:
                return
        time.sleep(0.5)
    raise TimeoutError(f"the demo served {served:.1f} s of cycles, not {seconds} s, within "
                       f"{timeout_seconds} s")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    prometheus_path()
    directory = tmp_path_factory.mktemp("fleet-demo")
    metrics_port = free_port()
    target = f"127.0.0.1:{metrics_port}"
    r = Run(target=target, log=directory / "demo.log")
    server = PrometheusServer([target], [RULES], directory=directory / "prometheus")
    started = time.time()
    with open(r.log, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specobs.cli", "demo", "--plain", "--duration",
             str(DEMO_MAX_SECONDS), "--port", str(free_port()),
             "--metrics-port", str(metrics_port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(), cwd=ROOT,
        )  # fmt: skip
    try:
        # Healthy and warmed up: the measured baseline (the probe needs 128 cycles: a minute on
        # a busy machine) is scraped and the 5m rules have a value; the dashboards also read
        # rules of other groups, so each group must have run since.
        server.wait_for(REALIZED, timeout_seconds=240)
        server.wait_for_rule_evaluations(after=time.time(), timeout_seconds=60)
        assert proc.poll() is None, r.log.read_text()[-3000:]

        doctor = subprocess.run(
            [sys.executable, "-m", "specobs.cli", "doctor", target, "--json", "--wait", "3"],
            capture_output=True, text=True, timeout=60, env=_env(), cwd=ROOT,
        )  # fmt: skip
        r.doctor_code = doctor.returncode
        r.doctor = json.loads(doctor.stdout)

        model = ""
        for path in DASHBOARDS:
            for name, selector, label in _variable_queries(path):
                selector = _substitute(selector, target, model)
                found = sorted({m["metric"].get(label, "") for m in
                                server.query(f"group by ({label}) ({selector})")} - {""})
                r.variables[f"{path}:{name}"] = found
                if name == "model" and found:
                    model = found[0]
        for path in DASHBOARDS:
            for title, ref, expr, no_value in _dashboard_targets(path):
                result = server.query(_substitute(expr, target, model))
                r.panels[(path, title, ref, expr, no_value)] = _values(result)

        _wait_served(server, target, started, DEMO_SECONDS, timeout_seconds=DEMO_SECONDS + 120)
        assert proc.poll() is None, r.log.read_text()[-3000:]
        proc.terminate()
        code = proc.wait(90)
        r.final_text = r.log.read_text()
        assert code == 0, r.final_text[-3000:]

        # The rule and the panel over the whole run, at the demo's last scrape.
        at = _last_up(server, target, started)
        rule = server.query(REALIZED, time=at)
        assert len(rule) == 1, rule
        r.rule_speedup = float(rule[0]["value"][1])
        r.rule_source = rule[0]["metric"].get("source")
        r.baseline = _values(server.query(
            f'specobs_baseline_sequence_tokens_per_second{{instance="{target}"}}', time=at))[0]
        panel = next(e for (p, t, ref, e, _) in r.panels if p == DASHBOARDS[0]
                     and t == "Speedup: realized vs predicted" and ref == "A")
        assert "specobs_baseline_sequence_tokens_per_second" in panel
        whole_run = f"{math.ceil(at - started) + 5}s"
        values = _values(server.query(_substitute(panel, target, model, whole_run), time=at))
        r.panel_speedup = values[0] if values else None
        empty = sorted({(p, t) for (p, t, _, _, _), v in r.panels.items() if not v})
        reasons = [c["reason"] for c in r.doctor["checks"] if c["name"] == "baseline"]
        print(f"\nfleet-demo: rule {r.rule_speedup} ({r.rule_source}), panel {r.panel_speedup}, "
              f"baseline {r.baseline}, demo {_demo_final(r.final_text)}, doctor "
              f"{r.doctor_code} {reasons}, {len(r.panels)} queries, empty {empty}")
        yield r
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()


def _demo_final(text: str) -> tuple[float, float, float]:
    """(per-sequence tokens/s, baseline, speedup) from the demo's final summary."""
    m = re.search(
        r"per-sequence ([\d.]+) tokens/s vs baseline ([\d.]+) \(measured while serving, same "
        r"batch\): speedup ([\d.]+)x", text)
    assert m, text[-3000:]
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


def test_every_dashboard_query_returns_a_number_for_a_healthy_server(run: Run) -> None:
    assert run.panels
    empty, bad = [], []
    for (path, title, ref, expr, no_value), values in run.panels.items():
        if not values:
            empty.append((path, title, ref, expr, no_value))
        bad += [(path, title, ref, v) for v in values if not math.isfinite(v)]
    assert bad == [], bad
    # A CPU has no GPU clock: only GPU-clock-only queries may be empty, and their panels say so;
    # and the demo has no vLLM or SGLang metrics for the engine-latency panels to read.
    for path, title, ref, expr, no_value in empty:
        if no_value == NO_ENGINE_METRICS:
            assert "vllm:" in expr or "sglang:" in expr, (path, title, ref, expr)
            continue
        assert 'clock="gpu"' in expr and 'clock="host"' not in expr, (path, title, ref, expr)
        assert no_value == NO_GPU_CLOCK, (path, title)
    # ... and everything else has data: both dashboards, every panel with a host-side query.
    answered = {(p, t) for (p, t, _, _, _), v in run.panels.items() if v}
    assert {p for p, _ in answered} == set(DASHBOARDS)
    assert len([e for e in empty if e[4] != NO_ENGINE_METRICS]) <= 4, empty


def test_the_model_variable_finds_the_demo(run: Run) -> None:
    for path in DASHBOARDS:
        assert run.variables[f"{path}:model"] == ["specobs-demo"], run.variables
        assert run.variables[f"{path}:job"] == ["specobs"], run.variables
        assert run.variables[f"{path}:instance"] == [run.target], run.variables


def test_realized_speedup_agrees_with_the_demo_within_15_percent(run: Run) -> None:
    speed, baseline, speedup = _demo_final(run.final_text)
    assert run.rule_source == "demo_measured"
    assert run.rule_speedup is not None and run.panel_speedup is not None
    assert run.rule_speedup == pytest.approx(speedup, rel=0.15), (run.rule_speedup, speedup)
    assert run.panel_speedup == pytest.approx(speedup, rel=0.15), (run.panel_speedup, speedup)
    assert run.baseline == pytest.approx(baseline, rel=0.15)
    # Like with like on a CPU: speculation beats plain decoding of the same batch.
    assert speedup > 1.0, run.final_text[-2000:]


def test_doctor_passes_on_the_healthy_demo(run: Run) -> None:
    checks = {c["name"]: c for c in run.doctor["checks"]}
    assert run.doctor_code == 0, run.doctor
    assert not [n for n, c in checks.items() if c["verdict"] == "FAIL"], run.doctor
    base = checks["baseline"]
    assert base["verdict"] == "OK", base
    assert base["data"]["source"] == "demo_measured"
    assert base["data"]["speedup"] > 1.0
    assert "speculation is faster" in base["reason"]
