"""``specobs fleet-sim``: the schedule, the exposition, and a 50-server fleet against the real
Prometheus with the generated rules at shortened windows — alerts fire for exactly the faulted
servers, and every fleet-dashboard query returns numbers."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from specobs import catalog
from specobs.cli import main
from specobs.mixin import MixinConfig, render_all
from specobs.mixin._panels import dashboard_queries, fill_variables
from specobs.mixin._rules import RuleNames
from specobs.tools.fleet._mix import parse_mix
from specobs.tools.fleet._schedule import ScheduleError, load_schedule
from specobs.tools.fleet._score import (
    SHORT_WINDOWS,
    AlertScore,
    firing_from_matrix,
    load_events,
    score,
)
from specobs.tools.fleet._sim import MODELS, Fleet
from tests._prometheus_server import PrometheusServer, prometheus_path, promtool

MODEL_NAMES = tuple(m.name for m in MODELS)


# -- the schedule ----------------------------------------------------------------------------------

def test_schedule_from_yaml_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "faults.yaml"
    path.write_text(
        "faults:\n"
        "  - {kind: acceptance_collapse, servers: [3], at: 90s, factor: 0.25}\n"
        "  - {kind: exporter_down, servers: 4, at: 2m, duration: 30s}\n"
        "  - {kind: bad_rollout, model: llama-3.1-70b, at: 1.5m}\n"
    )
    faults = load_schedule(path, ["stall servers=7,5 at=100"], 10, MODEL_NAMES)
    assert [f.describe() for f in faults] == [
        "acceptance_collapse servers=3 at=90s factor=0.25",
        "exporter_down servers=4 at=120s duration=30s",
        "bad_rollout model=llama-3.1-70b at=90s factor=0.3",
        "stall servers=5,7 at=100s",
    ]
    assert faults[1].active(130) and not faults[1].active(150) and not faults[1].active(119)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"faults": [{"kind": "melt", "servers": [1], "at": 1}]}', "kind must be one of"),
        ('{"faults": [{"kind": "stall", "servers": [10], "at": 1}]}', "not a server index in 0..9"),
        ('{"faults": [{"kind": "stall", "servers": [1]}]}', "missing 'at'"),
        ('{"faults": [{"kind": "stall", "servers": [1], "at": "soon"}]}', "expected a duration"),
        ('{"faults": [{"kind": "stall", "servers": [1], "at": 1, "factor": 2}]}',
         "takes no factor"),
        ('{"faults": [{"kind": "verify_slowdown", "servers": [1], "at": 1, "factor": "x"}]}',
         "factor: expected a number, got 'x'"),
        ('{"faults": [{"kind": "verify_slowdown", "servers": [1], "at": 1, "factor": 0}]}',
         r"factor: must be > 0, got 0"),
        ('{"faults": [{"kind": "stall", "servers": [], "at": 1}]}', "expected a list of server"),
        ('{"faults": [{"kind": "stall", "servers": true, "at": 1}]}', "expected a list of server"),
        ('{"faults": [{"kind": "stall", "servers": [1, false], "at": 1}]}',
         "False is not a server index"),
        ('{"faults": [{"kind": "bad_rollout", "model": "gpt-9", "at": 1}]}', "fleet's models"),
        ('{"faults": [{"kind": "stall", "model": "x", "servers": [1], "at": 1}]}', "takes servers"),
        ('{"faults": [{"kind": "stall", "servers": [1], "at": 1, "when": 2}]}', "unknown field"),
        ('{"faults": {"kind": "stall"}}', "a list under 'faults'"),
        ("{not json", "not valid JSON"),
    ],
)
def test_schedule_errors_are_clear(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "faults.json"
    path.write_text(text)
    with pytest.raises(ScheduleError, match=message):
        load_schedule(path, [], 10, MODEL_NAMES)


def test_a_schedule_takes_one_server_or_several_and_a_kinds_own_factor(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    path.write_text('{"faults": [{"kind": "verify_slowdown", "servers": 3, "at": "2m"},'
                    ' {"kind": "acceptance_collapse", "servers": [7, 2, 7], "at": 1,'
                    ' "factor": 0.5}]}')
    slow, collapse = load_schedule(path, [], 10, MODEL_NAMES)
    assert (slow.servers, slow.factor, slow.at_seconds) == ((3,), 2.5, 120.0)
    assert (collapse.servers, collapse.factor) == ((2, 7), 0.5)


def test_bad_flags_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet-sim", "--fault", "stall servers=x at=1"]) == 2
    assert "servers must be integers" in capsys.readouterr().err
    assert main(["fleet-sim", "--addr", "0.0.0.0"]) == 2
    assert "loopback" in capsys.readouterr().err


# -- the exposition --------------------------------------------------------------------------------

def test_exposition_is_the_sinks_and_valid() -> None:
    fleet = Fleet(8, [], seed=1)
    server = fleet.servers[5]
    server.advance(time.time(), time.monotonic() + 30)
    _, text = server.render("")
    check = promtool("check", "metrics", input=text.decode())
    assert check.returncode == 0, check.stderr + check.stdout
    names = {line.split("{")[0].split(" ")[0] for line in text.decode().splitlines()
             if line and not line.startswith("#")}
    for metric in catalog.CATALOG:
        if metric.otel_name == "specobs.info":
            assert "specobs_info" in names
            continue
        assert set(metric.series()) & names, metric.name
    ctype, om = server.render("application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and om.endswith(b"# EOF\n")
    assert b'model_name="' + server.model.name.encode() in text
    assert b'serving_engine="sglang"' in text


def test_each_phase_mean_between_two_scrapes_is_the_servers_own() -> None:
    """``rate(_sum) / rate(_count)`` over the shortest window — two scrapes of a fresh pod, a few
    sampled GPU cycles — reads the phase time the server was given, on both clocks; the
    cohort alerts compare these means, so a bias here fires them on healthy servers."""
    fleet = Fleet(16, [], seed=3)
    for server in fleet.servers:
        t = server.last_advance
        scrapes = []
        for _ in range(12):
            t += 3.0
            server.advance(time.time(), t)
            scrapes.append(server.snapshot().phase_histograms)
        for before, after in itertools.pairwise(scrapes):
            for (phase, clock), hist in after.items():
                count = hist.count - before[phase, clock].count
                if not count:
                    continue
                mean = (hist.sum - before[phase, clock].sum) / count
                want = server.hists[f"{phase}/{clock}"].mean
                assert mean == pytest.approx(want, rel=1e-9), (server.pod, phase, clock, count)


def test_the_time_between_cycles_and_the_batch_by_k_are_the_servers_own() -> None:
    """A simulated server is busy all the time: its cycles and the gaps between them fill the
    time it ran (the gaps' mean the one it was given, none idle), and the batch at its one k is
    its batch."""
    fleet = Fleet(4, [], seed=5)
    for server in fleet.servers:
        server.advance(time.time(), server.last_advance + 60.0)
        s = server.snapshot()
        gap, host = s.cycle_gap, s.cycle_histograms["host"]
        assert gap is not None and gap.count > 0 and s.idle_gaps_total == 0
        assert gap.sum / gap.count == pytest.approx(server.gap_seconds, rel=1e-9)
        assert host.sum + gap.sum == pytest.approx(60.0, rel=0.05)
        k = server.model.draft_length
        assert s.batch_by_draft_length == {k: s.batch_size.sum}
        assert s.cycles_by_draft_length == {k: s.cycles_total}


def test_restarts_follow_the_hourly_rate_however_often_the_fleet_ticks() -> None:
    """``restarts_per_hour`` is a rate in time: a tick a second after the last one restarts
    1 - exp(-rate * 1 s) of the servers, ticks in quick succession restart (almost) none."""
    n, rate = 2000, 360.0  # 0.1 restarts per server per second
    fleet = Fleet(n, [], seed=5, restarts_per_hour=rate, restart_downtime_seconds=60.0)

    def restarted() -> int:
        return sum(1 for s in fleet.servers if s.down_until > time.monotonic())

    fleet._last_tick_mono = time.monotonic() - 1.0
    fleet.tick()
    expected = n * -math.expm1(-rate / 3600.0)  # 190
    assert abs(restarted() - expected) < 5 * math.sqrt(expected), restarted()
    before = restarted()
    t0 = fleet._last_tick_mono  # the first tick's time: the next tick counts from there
    for _ in range(50):  # 50 ticks in quick succession: rate x elapsed, not x ticks
        fleet.tick()
    # However long the 50 ticks took on this machine (a few ms when quiet), the restarts follow
    # that time: per tick, 50 ticks would have restarted about 50 x 190.
    grown = (n - before) * -math.expm1(-rate / 3600.0 * (time.monotonic() - t0))
    assert restarted() - before < grown + 5 * math.sqrt(grown) + 10, (restarted() - before, grown)


# -- a fleet against the real Prometheus -----------------------------------------------------------

class _FileSdPrometheus(PrometheusServer):
    """The test fixture's Prometheus with one file_sd job: the simulator's target file."""

    def __init__(self, targets_file: Path, **kwargs: Any) -> None:
        self.targets_file = targets_file
        super().__init__([], **kwargs)

    def write_config(self) -> None:
        config = {
            "global": {"scrape_interval": self.scrape_interval,
                       "scrape_timeout": self.scrape_timeout,
                       "evaluation_interval": self.evaluation_interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [{
                "job_name": "specobs",
                "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "5s"}],
            }],
        }
        self.config_path.write_text(json.dumps(config, indent=2) + "\n")


N_SERVERS = 50
FAULT_AT = 50.0
# Each fault in a different cohort (model i % 4, engine (i // 4) % 2, cluster (i // 8) % 2).
FAULTS = [
    f"acceptance_collapse servers=0 at={FAULT_AT:g}",
    f"verify_slowdown servers=6 at={FAULT_AT:g}",
    f"stall servers=3 at={FAULT_AT:g}",
    f"exporter_down servers=12 at={FAULT_AT:g}",
    f"bad_rollout model=llama-3.1-70b at={FAULT_AT:g}",
]


def test_fleet_of_50_alerts_exactly_the_faulted_servers(tmp_path: Path) -> None:
    scores, table, evidence = _fleet_scores(tmp_path, N_SERVERS, FAULTS, EXPECTED_ALERTS)
    _assert_every_expected_alert_and_no_other(scores, EXPECTED_ALERTS, table, evidence)


def _assert_every_expected_alert_and_no_other(
    scores: dict[str, AlertScore], expected: set[str], table: Any, evidence: dict[str, Any]
) -> None:
    """Each expected alert caught every unit it should, no alert fired where it should not, and
    each caught its units in time."""
    for name in expected:
        assert scores[name].recall == 1.0, table
    for s in scores.values():
        assert s.precision in (None, 1.0), (table, evidence)
    # Detection within the shortened windows: the rate window (30 s) plus `for` plus scrapes.
    for name in expected:
        assert max(scores[name].delays_seconds) < 75, table


#: A mixed fleet of 22 servers, 2 models, 1 cluster: each engine's own series only (servers 0-14,
#: three per engine: models A, B, A), the plugin in vLLM with vLLM's own endpoint beside it
#: (15-19: A, B, A, B, A) and the same in SGLang (20-21: A, B). Model A is llama-3.1-8b, B
#: llama-3.1-70b.
MIXED_SERVERS = 22
MIXED_ENGINES = "vllm:3,sglang:3,trtllm:3,llamacpp:3,lmdeploy:3,vllm+plugin:5,sglang+plugin:2"
MIXED_FAULTS = [
    # One model-A server of each engine-only cohort (its partner is the cohort's other half).
    f"acceptance_collapse servers=0,3,6,9,12 at={FAULT_AT:g}",
    # Every model-B server, engine-only and plugin: one acceptance drop per cohort.
    f"bad_rollout model=llama-3.1-70b at={FAULT_AT:g}",
    # Judged where the plugin is loaded; not judged on engine-only server 2 (no phase timing).
    f"verify_slowdown servers=2,15 at={FAULT_AT:g}",
    # A plugin host whose engine's own request gauges say requests are running.
    f"stall servers=20 at={FAULT_AT:g}",
]
MIXED_EXPECTED = {"SpecobsAcceptanceBelowCohort", "SpecobsAcceptanceRateDrop",
                  "SpecobsPhaseLatencyAboveCohort", "SpecobsDecodingStalled"}


def test_mixed_fleet_of_engines_alerts_exactly_the_faulted_servers(tmp_path: Path) -> None:
    """Servers with only their engine's own series, of every engine in the rules' table, beside
    servers with specobs's plugin (and their engine's endpoint on the same host): the engines'
    acceptance reaches the fleet series with the simulated values, a plugin host counts once, and
    the alerts fire for exactly the faults each source can show."""
    scores, table, evidence = _fleet_scores(
        tmp_path, MIXED_SERVERS, MIXED_FAULTS, MIXED_EXPECTED, _mixed_fleet_is_read_right,
        mix=parse_mix(MIXED_ENGINES), models=2, clusters=1)
    # Every expected unit: 5 engine-only collapses; 7 cohorts of model B (5 engines' own, vLLM
    # and SGLang with the plugin); the plugin server's slowdown only; the stalled plugin host.
    assert {name: scores[name].expected for name in MIXED_EXPECTED} == {
        "SpecobsAcceptanceBelowCohort": 5, "SpecobsAcceptanceRateDrop": 7,
        "SpecobsPhaseLatencyAboveCohort": 1, "SpecobsDecodingStalled": 1}, table
    _assert_every_expected_alert_and_no_other(scores, MIXED_EXPECTED, table, evidence)


def _mixed_fleet_is_read_right(fleet: Fleet, prom: PrometheusServer, n: RuleNames) -> None:
    """Before the faults: each engine-only server's acceptance and accept length in the fleet
    series equal what it simulates, labelled with its engine and ``source="engine"``; each
    plugin host has one series per rule, the plugin's, while its engine's own is scraped."""
    def by_instance(expr: str) -> dict[str, tuple[dict[str, str], float]]:
        return {r["metric"]["instance"]: (r["metric"], float(r["value"][1]))
                for r in prom.query(expr)}

    acceptance = by_instance(n.acceptance)
    length = by_instance(n.accept_length_incl_bonus)
    position0 = by_instance(f'{n.acceptance_by_position}{{position="0"}}')
    seen = set()
    for s in fleet.servers:
        if s.kind.plugin:
            continue
        k, accept = s.model.draft_length, s.hists["accept"]
        labels, value = acceptance[s.instance]
        assert labels["serving_engine"] == s.engine and labels["source"] == "engine", labels
        assert labels["job"] == s.engine and labels["model_name"] == s.model.name, labels
        assert value == pytest.approx(accept.mean / k, rel=0.03), (s.instance, value)
        assert length[s.instance][1] == pytest.approx(1 + accept.mean, rel=0.03), s.instance
        if s.instance in position0:  # the engines with per-position counters
            share = sum(accept.fractions[1: k + 1])
            assert position0[s.instance][1] == pytest.approx(share, rel=0.03), s.instance
        seen.add(s.engine)
    assert seen == {"vllm", "sglang", "trtllm", "llamacpp", "lmdeploy"}
    assert {i.split(":")[0] for i in position0} >= {
        s.pod for s in fleet.servers if s.engine != "sglang" and not s.kind.plugin}
    plugin_hosts = [s for s in fleet.servers if s.kind.plugin]
    for rule in (n.drafted, n.accepted, n.emitted, n.sequences):
        series = prom.query(rule)
        for s in plugin_hosts:
            mine = [r["metric"] for r in series if r["metric"]["pod"] == s.pod]
            assert [m["instance"] for m in mine] == [s.instance], (rule, mine)
            assert "source" not in mine[0], (rule, mine)
    engines_own = prom.query('count by (pod) ({__name__=~"vllm:spec_decode_num_drafts_total|'
                             'sglang:spec_verify_calls_total", instance=~".*:(8000|30000)"})')
    assert {r["metric"]["pod"] for r in engines_own} >= {s.pod for s in plugin_hosts}


#: Checks on the healthy fleet, before its faults: (fleet, Prometheus, the rules' names).
HealthyCheck = Callable[[Fleet, PrometheusServer, RuleNames], None]


def _fleet_scores(tmp_path: Path, n_servers: int, fault_flags: list[str],
                  expected: set[str], healthy: HealthyCheck | None = None, **fleet_kwargs: Any
                  ) -> tuple[dict[str, AlertScore], Any, dict[str, Any]]:
    """Serve a fleet with these faults to a real Prometheus running the generated rules at
    shortened windows, and score the alerts that fired: the scores, a table of them and, for
    each false positive's instance, what it went through."""
    prometheus_path()
    config = MixinConfig(**SHORT_WINDOWS)  # type: ignore[arg-type]
    files = render_all(config)
    rules = tmp_path / "rules.yml"
    rules.write_text(files["deploy/prometheus/rules/specobs-rules.yml"])
    targets, events = tmp_path / "targets.json", tmp_path / "events.jsonl"
    faults = load_schedule(None, fault_flags, n_servers, MODEL_NAMES)
    # Prometheus first, on an empty target file: the faults are due FAULT_AT seconds after the
    # fleet is created, so its start-up (slow on a busy machine) must not eat into that time.
    targets.write_text("[]\n")
    started = threading.Event()
    loop = asyncio.new_event_loop()
    sim = threading.Thread(target=loop.run_forever, name="fleet-sim", daemon=True)
    sim.start()
    serving: concurrent.futures.Future[None] | None = None
    try:
        with _FileSdPrometheus(targets, rule_files=[rules], scrape_interval="3s",
                               evaluation_interval="3s", directory=tmp_path / "prom") as prom:
            fleet = Fleet(n_servers, faults, seed=7, restarts_per_hour=6.0,
                          restart_downtime_seconds=5.0, events_path=events, targets_path=targets,
                          **fleet_kwargs)
            # Served until the test is done with it; the duration is only a bound.
            serving = asyncio.run_coroutine_threadsafe(
                fleet.serve("127.0.0.1", 0, 600.0, lambda _f: started.set()), loop)
            assert started.wait(10)
            matrix, t0, failed_scrapes = _alerts_of_a_fleet(
                fleet, prom, files, expected,
                None if healthy is None else lambda: healthy(fleet, prom, RuleNames(config)))
        # Prometheus has stopped: its keep-alive connections to the simulator are closed.
    finally:
        _stop_simulator(loop, sim, serving)
    fleet_events = load_events(events)
    assert len(fleet_events) == len(fault_flags)
    scores = score(firing_from_matrix(matrix), fleet_events)
    table = {name: (s.precision, s.recall, [round(d) for d in s.delays_seconds], s.false)
             for name, s in scores.items()}
    print(table)
    # What a false positive's servers went through: the scrapes Prometheus saw fail (time, scrape
    # duration) and the simulator's restarts, faults and rollouts of that server.
    false_instances = {lab["instance"] for s in scores.values() for lab in s.false
                       if "instance" in lab}
    evidence = {
        inst: {"failed_scrapes": failed_scrapes.get(inst, []),
               "events": [(rec["kind"], round(rec["t"] - t0, 1))
                          for rec in map(json.loads, events.read_text().splitlines())
                          if any(srv.get("instance") == inst for srv in rec.get("servers", []))]}
        for inst in sorted(false_instances)}
    return scores, table, evidence


def _stop_simulator(loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                    serving: concurrent.futures.Future[None] | None) -> None:
    """Stop serving, wait for every connection handler to finish, then stop and close the loop.

    Called once Prometheus has stopped, so each handler has read the end of its connection and
    closes its socket; one still open when the loop closes is a ResourceWarning (an error in this
    suite). Waiting for the handlers, not for a while, closes every one; a handler still running
    after the bound is cancelled.
    """

    async def finish() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=30)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.sleep(0)  # the transports close their sockets in a callback

    try:
        if serving is not None:
            serving.cancel()
        asyncio.run_coroutine_threadsafe(finish(), loop).result(60)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


EXPECTED_ALERTS = {"SpecobsAcceptanceBelowCohort", "SpecobsPhaseLatencyAboveCohort",
                   "SpecobsDecodingStalled", "SpecobsExporterDown", "SpecobsAcceptanceRateDrop"}
#: After every expected alert fires, Prometheus keeps evaluating this long (4 evaluations at
#: 3 s) before the alerts are read, so false positives that fire a little later show too.
FALSE_POSITIVE_WATCH_SECONDS = 12.0


def _alerts_of_a_fleet(
    fleet: Fleet, prom: PrometheusServer, files: dict[str, str], expected: set[str],
    healthy: Callable[[], None] | None = None,
) -> tuple[Any, float, dict[str, list[tuple[float, str]]]]:
    """Prometheus over the running fleet: numbers before the faults (and ``healthy``'s checks),
    then the firing alerts.

    Also each instance's failed scrapes, as (seconds since the fleet started, that scrape's
    duration), so a false positive can be told from a scrape that really failed.
    """
    t0 = fleet.start_wall
    n_targets = len(fleet.by_path)  # one per endpoint: a server may serve two
    up = prom.wait_for("count(up == 1)", lambda r: bool(r) and float(r[0]["value"][1])
                       >= n_targets - 2, timeout_seconds=60)
    assert float(up[0]["value"][1]) >= n_targets - 2
    # A rule's health is "unknown" until its group first runs (each group on its own schedule,
    # the history group every 15 s): wait for every group to have run on the fleet's data.
    groups = prom.wait_for_rule_evaluations(after=time.time(), timeout_seconds=60)
    generated = yaml.safe_load(files["deploy/prometheus/rules/specobs-rules.yml"])["groups"]
    assert sorted(g["name"] for g in groups) == sorted(g["name"] for g in generated)
    assert {"specobs", "specobs-history", "specobs-dashboards"} <= {g["name"] for g in groups}
    rules_loaded = [r for g in groups for r in g["rules"]]
    assert all(r["health"] == "ok" for r in rules_loaded), [
        (r["name"], r["health"], r.get("lastError")) for r in rules_loaded
        if r["health"] != "ok"]

    # Before the faults: every fleet-dashboard query answers with numbers, nothing fires. The
    # dashboards read rules of several groups, some built on the first group's rules: each must
    # have run again since the first group's 30 s rates had values.
    prom.wait_for("instance:specobs_speedup:realized_rate30s", timeout_seconds=40)
    prom.wait_for_rule_evaluations(after=time.time(), timeout_seconds=30)
    assert time.time() < t0 + FAULT_AT, "the fleet's faults began before Prometheus had its data"
    time.sleep(max(0.0, t0 + 40 - time.time()))  # the schedule: 40 s of healthy fleet first
    fleet_dashboard = json.loads(files["dashboards/fleet.json"])
    for title, expr in dashboard_queries(fleet_dashboard):
        result = prom.query(fill_variables(expr, "30s"))
        if "alerts" in expr and not result:
            continue
        assert result, f"{title}: no result for {expr}"
        values = [float(s["value"][1]) for s in result]
        assert all(math.isfinite(v) for v in values), f"{title}: {values}"
    assert prom.query('ALERTS{alertstate="firing"}') == []
    if healthy is not None:
        healthy()
    assert time.time() < t0 + FAULT_AT, "the healthy fleet's checks ran into its faults"

    deadline = t0 + FAULT_AT + 75
    while time.time() < deadline:
        if expected <= {a["labels"]["alertname"] for a in prom.alerts()
                        if a["state"] == "firing"}:
            break
        time.sleep(2)
    prom.wait_for_rule_evaluations(after=time.time() + FALSE_POSITIVE_WATCH_SECONDS,
                                   timeout_seconds=FALSE_POSITIVE_WATCH_SECONDS + 30)
    end = time.time()
    failed: dict[str, list[tuple[float, str]]] = {}
    for series in prom.query_range("scrape_duration_seconds and up == 0", t0, end, 3):
        failed[series["metric"]["instance"]] = [(round(float(t) - t0, 1), v)
                                                for t, v in series["values"]]
    return prom.query_range('ALERTS{alertstate="firing"}', t0, end, 3), t0, failed


# -- the shipped scale-out configs -----------------------------------------------------------------

SCALE_OUT = Path(__file__).resolve().parents[1] / "deploy" / "scale-out"


def test_scale_out_prometheus_shard_config_is_valid(tmp_path: Path) -> None:
    import yaml

    config = yaml.safe_load((SCALE_OUT / "prometheus-shard.yml").read_text())
    assert config["global"]["external_labels"]["cluster"]
    job = config["scrape_configs"][0]
    assert job["job_name"] == MixinConfig().selector.split('"')[1]
    # Debian's promtool is built without Kubernetes service discovery: check the rest of the
    # config with the discovery swapped for a static target.
    del job["kubernetes_sd_configs"]
    job["static_configs"] = [{"targets": ["127.0.0.1:9477"]}]
    path = tmp_path / "shard.yml"
    path.write_text(yaml.safe_dump(config))
    check = promtool("check", "config", path)
    assert check.returncode == 0, check.stdout + check.stderr
    keep = config["remote_write"][0]["write_relabel_configs"][0]["regex"]
    import re

    for name in ("specobs_cycles_total", "up", "vllm:num_requests_running",
                 "sglang:num_queue_reqs"):
        assert re.fullmatch(keep, name), name
    assert not re.fullmatch(keep, "instance:specobs_cycles:rate5m")


def test_scale_out_compose_and_collector_configs(tmp_path: Path) -> None:
    import shutil
    import subprocess

    import yaml

    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    cp = subprocess.run(["docker-compose", "-f", str(SCALE_OUT / "docker-compose.yml"),
                         "config", "-q"], capture_output=True, text=True, check=False)
    assert cp.returncode == 0, cp.stderr
    compose = yaml.safe_load((SCALE_OUT / "docker-compose.yml").read_text())
    vmalert = compose["services"]["vmalert"]
    rules_mount = vmalert["volumes"][0].split(":")[0]
    assert (SCALE_OUT / rules_mount).resolve() == (
        SCALE_OUT.parents[0] / "prometheus" / "rules" / "specobs-rules.yml").resolve()
    flags = [ln for ln in (SCALE_OUT / "vmalert.flags").read_text().splitlines()
             if ln and not ln.startswith("#")]
    assert set(vmalert["command"]) <= set(flags)  # the same vmalert, in compose or by hand
    collector = yaml.safe_load((SCALE_OUT / "otel-collector.yaml").read_text())
    exporter = collector["exporters"]["prometheusremotewrite"]
    assert exporter["endpoint"].startswith("http://vminsert:8480/")
    assert exporter["resource_to_telemetry_conversion"]["enabled"] is True
    keys = {a["key"] for a in collector["processors"]["resource/cluster"]["attributes"]}
    assert {"cluster", "namespace", "pod"} <= keys
