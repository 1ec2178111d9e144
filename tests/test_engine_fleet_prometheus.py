"""One fleet view for every engine, end to end: a real Prometheus (Debian's 2.42) with the
generated rules scrapes five engine servers without specobs's plugin -- vLLM, SGLang,
TensorRT-LLM, llama.cpp and LMDeploy, each serving its own exposition as the engine writes it
(tests/_engine_exposition.py) -- and one server with the plugin (a real Observer exporting).

The fleet dashboard's own expressions (read from the generated JSON, variables filled as Grafana
sends them for "All") show all six servers with the acceptance and tokens/s their inputs give;
when llama.cpp's draft collapses, the acceptance-drop alert fires for its cohort and no other,
and ``specobs doctor --prometheus`` names the server. Windows are shortened through the config;
every wait polls what Prometheus holds, with a deadline.

Every engine is alone in its cohort here (its own job, model and engine), so the cohort
alert that compares a server with its peers (SpecobsAcceptanceBelowCohort) has no peer to
compare with and stays silent; the collapse is caught against the cohort's own past
(SpecobsAcceptanceRateDrop), which a cohort of one server reads as the server's.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specobs.mixin import render_all
from specobs.mixin._panels import NEEDS_PLUGIN, NEEDS_PLUGIN_VALUE, fill_variables
from specobs.mixin._rules import AlertNames
from tests._engine_exposition import EngineExposition, Workload, engine_hosts, workload_figures
from tests._prometheus_server import short_windows
from tests._sink_recorder import SinkRecorder
from tests.test_top import cli_here

try:
    import specobs

    specobs.PrometheusSink  # noqa: B018 - prometheus_client present?
    _MISSING = ""
except (ImportError, AttributeError) as exc:
    _MISSING = f"the specobs PrometheusSink ({exc})"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_MISSING), reason=f"needs {_MISSING}")]

RULES = "deploy/prometheus/rules/specobs-rules.yml"
CONFIG = short_windows(cohort_for="2s")
MODEL = "llama-3-8b"

#: Each engine's workload: different k, acceptance and traffic, so that no two servers give
#: the same figures and a value in the wrong row shows.
WORKLOADS = {
    "vllm": Workload(drafts_per_second=40, k=3, position_acceptance=(0.8, 0.6, 0.4)),
    "sglang": Workload(drafts_per_second=30, k=4, position_acceptance=(0.7, 0.5, 0.3, 0.2)),
    "trtllm": Workload(drafts_per_second=50, k=2, position_acceptance=(0.9, 0.7)),
    "llamacpp": Workload(drafts_per_second=60, k=3, position_acceptance=(0.85, 0.65, 0.45)),
    "lmdeploy": Workload(drafts_per_second=25, k=5,
                         position_acceptance=(0.8, 0.6, 0.5, 0.3, 0.2)),
}
COLLAPSING = "llamacpp"
#: The draft wired wrong: most first tokens rejected, those that pass still agree often.
COLLAPSED = (0.15, 0.1, 0.05)


class PluginServer(SinkRecorder):
    """A server with specobs's plugin: a real Observer and PrometheusSink, running a fixed
    number of speculative cycles per second (paced on the wall clock, catching up after a slow
    moment) with the same acceptance every cycle, so its figures are known."""

    CYCLES_PER_SECOND = 40.0
    K = 4
    ACCEPTED = (3, 2)  # per sequence, batch 2

    def __init__(self) -> None:
        self._started: float | None = None
        self._done = 0
        super().__init__(
            name="plugin-server",
            pool_size=4096,
            max_draft_length=self.K,
            labels={"model_name": MODEL, "serving_engine": "transformers"},
            pause_seconds=0.005,
            # The pacing waits between bursts of cycles: idle, not the engine's overhead.
            idle_gap_seconds=0.001,
        )

    @property
    def acceptance(self) -> float:
        return sum(self.ACCEPTED) / (self.K * len(self.ACCEPTED))

    @property
    def emitted_per_second(self) -> float:
        return self.CYCLES_PER_SECOND * (len(self.ACCEPTED) + sum(self.ACCEPTED))

    def step(self) -> None:
        if self._started is None:
            self._started = time.monotonic()
        due = int((time.monotonic() - self._started) * self.CYCLES_PER_SECOND)
        while self._done < due:
            self.cycle(self.ACCEPTED, draft_length=self.K)
            self._done += 1
        self.obs.set_requests(running=len(self.ACCEPTED), waiting=0)


class Fleet:
    def __init__(self, plugin: PluginServer, engines: dict[str, EngineExposition]) -> None:
        self.plugin, self.engines = plugin, engines

    def expected(self) -> dict[str, dict[str, Any]]:
        """Instance -> its engine label, acceptance and tokens/s, from the inputs."""
        out = {self.plugin.target: {"serving_engine": "transformers", "job": "specobs",
                                    "source": "plugin",
                                    "acceptance": self.plugin.acceptance,
                                    "emitted_per_second": self.plugin.emitted_per_second}}
        for name, server in self.engines.items():
            out[server.target] = {"serving_engine": name, "job": name, "source": "engine",
                                  **workload_figures(name, server.workload)}
        return out


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    plugin = PluginServer()
    engines: dict[str, EngineExposition] = {}
    try:
        for (name, workload), host in zip(WORKLOADS.items(), engine_hosts(len(WORKLOADS)),
                                          strict=True):
            engines[name] = EngineExposition(name, replace(workload, model=MODEL), host=host)
        yield Fleet(plugin, engines)
    finally:
        for server in engines.values():
            server.stop()
        plugin.stop()


def _servers_table(dashboard: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in _panels(dashboard["panels"])
                if p.get("type") == "table" and p.get("title") == "Servers")


def _servers_columns(dashboard: dict[str, Any]) -> dict[str, str]:
    """The fleet dashboard's "Servers" table: column header -> its query, as generated."""
    table = _servers_table(dashboard)
    renames = next(t["options"]["renameByName"] for t in table["transformations"]
                   if t["id"] == "organize")
    return {renames[f"Value #{t['refId']}"]: t["expr"] for t in table["targets"]}


def _cell_text(dashboard: dict[str, Any], header: str, value: float) -> str | None:
    """What a cell of ``header`` shows for ``value`` by the column's value mappings."""
    table = _servers_table(dashboard)
    override = next(o for o in table["fieldConfig"]["overrides"]
                    if o["matcher"]["options"] == header)
    for prop in override["properties"]:
        if prop["id"] == "mappings":
            for mapping in prop["value"]:
                if mapping["type"] == "value" and float(next(iter(mapping["options"]))) == value:
                    return str(next(iter(mapping["options"].values()))["text"])
    return None


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def _by_instance(result: list[dict[str, Any]]) -> dict[str, tuple[dict[str, str], float]]:
    return {r["metric"]["instance"]: (r["metric"], float(r["value"][1])) for r in result}


def _matches(expected: dict[str, dict[str, Any]], key: str, rel: float
             ) -> Callable[[list[dict[str, Any]]], bool]:
    """A predicate: the result holds exactly the expected servers, each with its engine label
    and ``key``'s figure within ``rel``."""

    def check(result: list[dict[str, Any]]) -> bool:
        got = _by_instance(result)
        return set(got) == set(expected) and all(
            got[i][0].get("serving_engine") == e["serving_engine"]
            and got[i][0].get("source") == e["source"]
            and math.isclose(got[i][1], e[key], rel_tol=rel)
            for i, e in expected.items()
        )

    return check


def test_every_engine_and_the_plugin_on_one_fleet_view(
    prometheus_server: Callable[..., Any], fleet: Fleet, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = render_all(CONFIG)
    rules = tmp_path / "specobs-rules.yml"
    rules.write_text(files[RULES])
    server = prometheus_server(
        [fleet.plugin.target], rule_files=[rules],
        extra_jobs={name: [s.target] for name, s in fleet.engines.items()})
    server.wait_for_target_up(timeout_seconds=30)

    dashboard = json.loads(files["dashboards/fleet.json"])
    columns = _servers_columns(dashboard)
    tokens = fill_variables(columns["Tokens/s"], "4s")
    acceptance = fill_variables(columns["Acceptance"], "4s")
    expected = fleet.expected()
    assert len(expected) == 6

    # Acceptance is a ratio of counters (or an engine's own gauge): exact but for whole-token
    # rounding, which grows when a slow machine puts two scrapes close together inside the
    # rate's window (a token in a hundred). Tokens/s is a rate: within the scrapes' timing.
    got = _by_instance(server.wait_for(acceptance, _matches(expected, "acceptance", 0.03),
                                       timeout_seconds=60))
    for instance, e in expected.items():
        labels, value = got[instance]
        assert labels["serving_engine"] == e["serving_engine"], instance
        assert value == pytest.approx(e["acceptance"], rel=0.03), instance
    got = _by_instance(server.wait_for(tokens, _matches(expected, "emitted_per_second", 0.1),
                                       timeout_seconds=60))
    for instance, e in expected.items():
        assert got[instance][1] == pytest.approx(e["emitted_per_second"], rel=0.1), instance
        assert got[instance][0]["source"] == e["source"], instance
    # Every server is up, its engine endpoint or the plugin's.
    up = _by_instance(server.query(fill_variables(columns["Up"], "4s")))
    assert {i: v for i, (_, v) in up.items()} == dict.fromkeys(expected, 1.0)
    # A column only the plugin measures: the plugin's server has its figure; every engine
    # server a cell that reads "needs the plugin", not a zero.
    batch = _by_instance(server.wait_for(
        fill_variables(columns["Mean batch"], "4s"), lambda r: len(r) == 6, timeout_seconds=30))
    assert batch[fleet.plugin.target][1] == pytest.approx(len(PluginServer.ACCEPTED), rel=0.01)
    for engine in fleet.engines.values():
        labels, value = batch[engine.target]
        assert (labels["source"], value) == ("engine", NEEDS_PLUGIN_VALUE), engine.target
    assert _cell_text(dashboard, "Mean batch", NEEDS_PLUGIN_VALUE) == NEEDS_PLUGIN

    # The engine servers alone selected: every other fleet panel has data, or is one that says
    # it needs the plugin, and then has none (never a zero).
    engine_only = {"job": "|".join(fleet.engines),
                   "instance": "|".join(e.target for e in fleet.engines.values())}
    for panel in _panels(dashboard["panels"]):
        if panel["type"] in ("row", "table"):
            continue
        results = [server.query(fill_variables(t["expr"], "4s", engine_only))
                   for t in panel["targets"]]
        needs = panel["fieldConfig"]["defaults"].get("noValue") == NEEDS_PLUGIN
        assert any(results) != needs, (panel["title"], results)

    # A healthy past for the drop alert: its reference reaches back the history window plus
    # its offset, in history steps.
    n_cohort = "cohort:specobs_acceptance:avg2s_ratio_rate4s"
    server.wait_for_history(n_cohort, seconds=16, step_seconds=2, timeout_seconds=90)
    assert [a for a in server.alerts()
            if a["labels"]["alertname"] == AlertNames.ACCEPTANCE_RATE_DROP] == []

    collapsing = fleet.engines[COLLAPSING]
    collapsing.workload = replace(collapsing.workload, position_acceptance=COLLAPSED)
    expected = fleet.expected()
    server.wait_for_firing(AlertNames.ACCEPTANCE_RATE_DROP, timeout_seconds=60)
    # The collapse shows in the dashboard's acceptance column, the others unchanged.
    server.wait_for(acceptance, _matches(expected, "acceptance", 0.03), timeout_seconds=30)
    firing = server.firing(AlertNames.ACCEPTANCE_RATE_DROP)
    assert [(a["labels"]["job"], a["labels"]["serving_engine"]) for a in firing] == [
        (COLLAPSING, COLLAPSING)], firing
    assert firing[0]["labels"].get("model_name") is None  # llama.cpp labels no model
    # One server per cohort: no peers to fall below.
    assert server.firing(AlertNames.ACCEPTANCE_BELOW_COHORT) == []

    # doctor over the whole Prometheus names the server, and only that one fails.
    rc, out, err = cli_here(capsys, "doctor", "--prometheus", server.url, "--window", "4s",
                            "--history", "8s", "--json")
    assert err == "" and rc == 1, (rc, err, out)
    report = json.loads(out)
    lines = {c["name"]: c for c in report["checks"]}
    assert set(expected) <= set(lines)
    assert lines[collapsing.target]["verdict"] == "FAIL", lines[collapsing.target]
    assert "SPEC-ACCEPT-COLLAPSE" in lines[collapsing.target]["reason"]
    assert [i for i in expected if lines[i]["verdict"] == "FAIL"] == [collapsing.target]
    failed = [f for f in report["findings"] if f["severity"] == "fail"]
    assert [(f["code"], f["evidence"]["instance"]) for f in failed] == [
        ("SPEC-ACCEPT-COLLAPSE", collapsing.target)], failed
    assert failed[0]["sentence"].startswith(f"{collapsing.target} (llama.cpp server, engine")
    # What needs the plugin is said so for the five engine servers, never judged.
    needs = lines["needs the plugin"]
    assert needs["verdict"] == "SKIP"
    assert sorted(needs["data"]["instances"]) == sorted(s.target for s in fleet.engines.values())
