"""Grafana dashboard-linter rules, written as tests (the linter binary is not installable here),
plus the mixin's own layout and fleet rules."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest

from specobs import catalog
from specobs.mixin import MixinConfig, render_all
from specobs.mixin._dashboards import ENGINE_LATENCY, NO_ENGINE_METRICS
from specobs.mixin._panels import NEEDS_PLUGIN
from specobs.mixin._rules import RuleNames, _reads, recording_rules
from tests.test_mixin_promql import label_values_query, selectors

PATHS = ("dashboards/cycle-breakdown.json", "dashboards/fleet.json")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE_FUNCTIONS = ("rate(", "irate(", "increase(")


def _load(config: MixinConfig = MixinConfig()) -> dict[str, dict[str, Any]]:  # noqa: B008
    files = render_all(config)
    return {path: json.loads(files[path]) for path in PATHS}


DASHBOARDS = _load()


def _engine_series(text: str) -> bool:
    """Whether an expression or a series name reads the engines' own metrics."""
    return any(f"{name}_bucket" in text for _, _, names in ENGINE_LATENCY for name in names)


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel but the rows, those inside collapsed rows included."""
    out = []
    for p in dashboard["panels"]:
        if p["type"] == "row":
            out += p.get("panels", [])
        else:
            out.append(p)
    return out


def targets(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in panels(dashboard) for t in p["targets"]]


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


params = pytest.mark.parametrize("path", PATHS)


@params
def test_template_datasource_rule(path: str) -> None:
    ds = variables(DASHBOARDS[path])["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"


@params
def test_template_group_job_model_instance_rules(path: str) -> None:
    vs = variables(DASHBOARDS[path])
    # The fleet picks servers by engine too (with the plugin, or the engines' own series).
    engine = ["serving_engine"] if path == "dashboards/fleet.json" else []
    assert list(vs) == ["datasource", "cluster", "namespace", "job", "model", *engine,
                        "instance", "filters"]
    assert vs["filters"]["type"] == "adhoc" and vs["filters"]["datasource"] == DATASOURCE
    if engine:
        assert 'model_name=~"$model"' in vs["serving_engine"]["query"]
        assert 'serving_engine=~"$serving_engine"' in vs["instance"]["query"]
        assert vs["serving_engine"]["allValue"] == ".*"
    for name in ("cluster", "namespace", "job", "model", *engine, "instance"):
        v = vs[name]
        assert v["type"] == "query"
        assert v["datasource"] == DATASOURCE
        assert v["multi"] and v["includeAll"], name
        assert v["refresh"] == 2, f"{name}: must refresh on time range change"
        _metric, label = label_values_query(v["query"])
        assert label == ("model_name" if name == "model" else name)
    assert 'cluster=~"$cluster"' in vs["namespace"]["query"]
    assert 'job=~"$job"' in vs["instance"]["query"]
    assert 'model_name=~"$model"' in vs["instance"]["query"]
    # Series without a model or cluster label must still match when "All" is selected.
    assert vs["model"]["allValue"] == ".*" and vs["cluster"]["allValue"] == ".*"


def test_cycle_breakdown_opens_on_one_instance_and_can_show_several() -> None:
    instance = variables(DASHBOARDS["dashboards/cycle-breakdown.json"])["instance"]
    assert instance["multi"] is True and instance["includeAll"] is True
    # No "All" as the default: Grafana opens on the first server.
    assert instance.get("current", {}).get("value") in (None, "")
    fleet = variables(DASHBOARDS["dashboards/fleet.json"])["instance"]
    assert fleet["current"]["value"] == "$__all"


def test_fleet_rows_drill_down_to_the_server_and_dashboards_link_each_other() -> None:
    fleet = DASHBOARDS["dashboards/fleet.json"]
    table = next(p for p in panels(fleet) if p["type"] == "table")
    links = [
        prop["value"][0]
        for o in table["fieldConfig"]["overrides"]
        if o["matcher"]["options"] == "instance"
        for prop in o["properties"]
        if prop["id"] == "links"
    ]
    assert links and links[0]["url"].startswith("/d/specobs-cycle-breakdown?")
    assert "var-instance=${__data.fields.instance}" in links[0]["url"]
    for dashboard in DASHBOARDS.values():
        assert dashboard["links"][0]["tags"] == ["specobs"]
        assert dashboard["links"][0]["includeVars"] and dashboard["links"][0]["keepTime"]
    engine = DASHBOARDS["dashboards/cycle-breakdown.json"]["links"][1]
    assert engine["title"] == "Engine dashboards" and engine["tags"] == ["vllm", "sglang"]
    assert len(DASHBOARDS["dashboards/fleet.json"]["links"]) == 1
    off = _load(MixinConfig(engine_dashboard_tags=()))
    assert len(off["dashboards/cycle-breakdown.json"]["links"]) == 1


def test_the_fleet_table_names_the_model_shows_the_speedup_and_colours_what_is_wrong() -> None:
    table = next(p for p in panels(DASHBOARDS["dashboards/fleet.json"]) if p["type"] == "table")
    order = table["transformations"][1]["options"]["indexByName"]
    assert "model_name" in order and "serving_engine" in order and "instance" in order
    props = {o["matcher"]["options"]: {q["id"]: q["value"] for q in o["properties"]}
             for o in table["fieldConfig"]["overrides"]}
    assert "instance:specobs_speedup:realized_rate" in next(
        t["expr"] for t in table["targets"] if t["legendFormat"] == "Speedup")
    for column, below, above in (("Speedup", "red", "green"), ("Up", "red", "green"),
                                 ("Firing alerts", "green", "red")):
        assert props[column]["custom.cellOptions"] == {"type": "color-background"}, column
        steps = props[column]["thresholds"]["steps"]
        assert [st["color"] for st in steps] == [below, above] and steps[1]["value"] == 1.0
    # A server with no cycle for as long as the stall alert waits turns red.
    steps = props["Last cycle age"]["thresholds"]["steps"]
    assert [st["color"] for st in steps] == ["green", "red"] and steps[1]["value"] == 45.0


def test_the_engines_own_latency_sits_beside_the_cycle_view_and_says_when_it_is_missing() -> None:
    cb = {p["title"]: p for p in panels(DASHBOARDS["dashboards/cycle-breakdown.json"])}
    for title, _, names in ENGINE_LATENCY:
        panel = cb[f"{title} p50 / p99 (engine)"]
        assert panel["fieldConfig"]["defaults"]["noValue"] == NO_ENGINE_METRICS
        exprs = [t["expr"] for t in panel["targets"]]
        assert len(exprs) == 2 * len(names)
        for name in names:
            assert any(f"{name}_bucket{{" in e for e in exprs), name
        for e in exprs:
            assert 'model_name=~"$model"' in e and "$instance" not in e and "$job" not in e


def _engine_fed() -> set[str]:
    """The recording rules the engines' own series feed (directly or through another rule)."""
    rules = {r.record: r.expr for r in recording_rules(MixinConfig())}
    fed = set(RuleNames(MixinConfig()).engine.values())
    for record, expr in rules.items():  # evaluation order: inputs come first
        if _reads(expr) & fed:
            fed.add(record)
    return fed


@params
def test_no_nan_where_a_value_or_no_traffic_belongs(path: str) -> None:
    """Every division guards its denominator, every quantile drops NaN, and empty panels say
    "No traffic" (GPU-clock-only panels: "No GPU-timed cycles", true on a busy CPU server;
    fleet panels no engine's own series feed: "Needs specobs's plugin", what a selection of
    servers without it sees; a rule fed by the engines may still need the plugin, as a ratio
    over cycle time does: tests/test_engine_fleet_prometheus.py checks those on a real
    Prometheus)."""
    fed = _engine_fed()
    for panel in panels(DASHBOARDS[path]):
        defaults = panel["fieldConfig"]["defaults"]
        gpu_only = all('clock="gpu"' in t["expr"] for t in panel["targets"])
        engine = all(_engine_series(t["expr"]) for t in panel["targets"])
        plugin_only = path == "dashboards/fleet.json" and panel["type"] != "table" and not any(
            _reads(t["expr"]) & fed for t in panel["targets"])
        expected = ("No GPU-timed cycles" if gpu_only else NO_ENGINE_METRICS if engine
                    else NEEDS_PLUGIN if plugin_only else "No traffic")
        if path == "dashboards/fleet.json" and expected == "No traffic":
            assert defaults.get("noValue") in (expected, NEEDS_PLUGIN), panel["title"]
        else:
            assert defaults.get("noValue") == expected, panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            division = r"\n *\/(?: (?:on|ignoring) \([^)]*\)(?: group_\w+ \([^)]*\))?)?\n"
            for match in re.finditer(division, expr):
                after = expr[match.end() :].lstrip()
                assert after.startswith("("), (panel["title"], expr)
            if "histogram_quantile" in expr:
                assert expr.rstrip().endswith(">= 0"), (panel["title"], expr)


def test_units_are_right() -> None:
    cb = {p["title"]: p for p in panels(DASHBOARDS["dashboards/cycle-breakdown.json"])}
    since = cb["Time since the last cycle"]
    override = since["fieldConfig"]["overrides"][0]
    assert override["matcher"]["options"].startswith("waiting requests")
    assert {"id": "unit", "value": "short"} in override["properties"]
    for dashboard in DASHBOARDS.values():
        for panel in panels(dashboard):
            if panel["fieldConfig"]["defaults"].get("unit") == "percentunit":
                if panel["type"] == "timeseries":
                    assert panel["fieldConfig"]["defaults"]["max"] == 1, panel["title"]


def test_accept_length_is_named_apart_from_vllms() -> None:
    cb = {p["title"]: p for p in panels(DASHBOARDS["dashboards/cycle-breakdown.json"])}
    title = next(t for t in cb if "excl. bonus" in t)
    legends = [t["legendFormat"] for t in cb[title]["targets"]]
    assert any("incl. bonus" in legend for legend in legends)
    for dashboard in DASHBOARDS.values():
        assert "Mean accept length" not in {p["title"] for p in panels(dashboard)}


@params
def test_panel_datasource_rule(path: str) -> None:
    for panel in panels(DASHBOARDS[path]):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']}: panel without targets"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]


@params
def test_panel_title_description_and_units_rules(path: str) -> None:
    for panel in panels(DASHBOARDS[path]):
        assert panel["title"].strip(), panel
        assert panel["description"] and len(panel["description"]) > 20, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        if panel["type"] == "table":
            for override in panel["fieldConfig"]["overrides"]:
                props = {p["id"]: p["value"] for p in override["properties"]}
                assert props.get("unit") or props.get("links"), override


@params
def test_target_job_and_instance_rules(path: str) -> None:
    for title, target in targets(DASHBOARDS[path]):
        found = selectors(target["expr"])
        assert found, title
        for name, _, matchers in found:
            assert 'cluster=~"$cluster"' in matchers, f"{title}: {name} lacks the cluster"
            if _engine_series(name):  # the engine's own scrape job and port: by model only
                assert 'model_name=~"$model"' in matchers, f"{title}: {name} lacks the model"
                continue
            assert 'job=~"$job"' in matchers, f'{title}: {name} lacks job=~"$job"'
            # cohort: series have no instance (the fleet heatmaps say so in their description).
            if not name.startswith("cohort:"):
                assert 'instance=~"$instance"' in matchers, f"{title}: {name} lacks the instance"
            assert 'cluster=~"$cluster"' in matchers, f"{title}: {name} lacks the cluster"


@params
def test_target_rate_interval_rule(path: str) -> None:
    for title, target in targets(DASHBOARDS[path]):
        ranges = re.findall(r"\[([^\]]*)\]", target["expr"])
        assert all(r == "$__rate_interval" for r in ranges), f"{title}: {ranges}"
        for function in RATE_FUNCTIONS:
            for match in re.finditer(re.escape(function), target["expr"]):
                rest = target["expr"][match.end() :]
                assert re.match(r"[^()\[]*\[\$__rate_interval\]\)", rest), title


@params
def test_target_counter_agg_rule(path: str) -> None:
    """Counters (and histogram series, which are counters) only inside rate/increase."""
    counters = {
        series
        for m in catalog.CATALOG
        if m.kind in ("counter", "histogram")
        for series in m.series()
    }
    for title, target in targets(DASHBOARDS[path]):
        expr = target["expr"]
        for name, start, _ in selectors(expr):
            if name in counters:
                before = expr[:start]
                assert before.endswith(RATE_FUNCTIONS), f"{title}: bare counter {name}"


@params
def test_target_promql_is_not_empty_and_refids_unique(path: str) -> None:
    for panel in panels(DASHBOARDS[path]):
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"])


@params
def test_dashboard_is_uneditable_with_fixed_uid_and_ids(path: str) -> None:
    dashboard = DASHBOARDS[path]
    assert dashboard["editable"] is False
    assert dashboard["uid"] == "specobs-" + path.split("/")[1].removesuffix(".json")
    assert dashboard["title"].startswith("Speculative decoding — ")
    assert "id" not in dashboard  # provisioning assigns it
    ids = [p["id"] for p in dashboard["panels"]]
    assert all(isinstance(i, int) for i in ids) and len(ids) == len(set(ids))
    assert _load()[path] == dashboard  # same uids, ids and positions every time


@params
def test_grid_positions_are_fixed_and_do_not_overlap(path: str) -> None:
    boxes = []
    for panel in DASHBOARDS[path]["panels"]:
        pos = panel["gridPos"]
        assert set(pos) == {"h", "w", "x", "y"}, panel["title"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        boxes.append((panel["title"], pos))
    for (a_title, a), (b_title, b) in itertools.combinations(boxes, 2):
        overlap = (
            a["x"] < b["x"] + b["w"]
            and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"]
            and b["y"] < a["y"] + a["h"]
        )
        assert not overlap, f"{a_title!r} overlaps {b_title!r}"


def test_fleet_reads_recording_rules_only() -> None:
    recorded = {r.record for r in recording_rules(MixinConfig())}
    fleet = DASHBOARDS["dashboards/fleet.json"]
    exprs = [t["expr"] for _, t in targets(fleet)]
    exprs += [label_values_query(v["query"])[0] for v in variables(fleet).values()
              if v["type"] == "query"]  # fmt: skip
    for expr in exprs:
        names = {name for name, _, _ in selectors(expr)}
        # up: whether a server without the plugin answers its engine's scrape (one instant
        # series per server, as cheap as a recorded one).
        assert names and names <= recorded | {"up"}, f"raw series {names - recorded} in {expr!r}"
        assert not names & {"cohort:specobs_servers:count"} or True
        assert "rate(" not in expr and "$__rate_interval" not in expr


def test_cycle_breakdown_opens_on_the_headline_numbers_with_host_data_top_left() -> None:
    cb = DASHBOARDS["dashboards/cycle-breakdown.json"]
    top = cb["panels"]
    assert top[0]["type"] == "row" and top[0]["title"] == "At a glance"
    stats = [p for p in top if p["type"] == "stat"]
    assert [p["title"] for p in stats] == [
        "Tokens/s", "Speedup", "Acceptance rate", "Mean acceptance length", "Cycle p99"]
    assert all(p["gridPos"]["y"] == 1 for p in stats)
    assert sum(p["gridPos"]["w"] for p in stats) == 24
    for p in stats:
        assert p["fieldConfig"]["defaults"]["noValue"] == "No traffic", p["title"]
    speedup = next(p for p in stats if p["title"] == "Speedup")
    steps = speedup["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [(st["color"], st.get("value")) for st in steps] == [("red", None), ("green", 1.0)]
    # The first panel of the cycle view has data on every engine: the host clock's.
    first = next(p for p in top if p["type"] == "timeseries")
    assert "host clock" in first["title"] and 'clock="host"' in first["targets"][0]["expr"]


def test_the_speedup_panel_draws_a_line_at_one() -> None:
    cb = {p["title"]: p for p in panels(DASHBOARDS["dashboards/cycle-breakdown.json"])}
    defaults = cb["Speedup: realized vs predicted"]["fieldConfig"]["defaults"]
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "dashed"
    assert defaults["thresholds"]["steps"][1]["value"] == 1.0


def test_exporter_health_is_a_collapsed_row_at_the_bottom() -> None:
    top = DASHBOARDS["dashboards/cycle-breakdown.json"]["panels"]
    rows = [p for p in top if p["type"] == "row"]
    assert rows[-1]["title"] == "Exporter health" and rows[-1]["collapsed"] is True
    inside = {p["title"] for p in rows[-1]["panels"]}
    assert {"Dropped records and errors", "GPU timing overhead"} <= inside
    # A stall is what on-call opens the dashboard for: its panel is in view, not folded away.
    assert "Time since the last cycle" in {p["title"] for p in top} - inside
    assert not inside & {p["title"] for p in top}
    assert all(not r["collapsed"] and r.get("panels", []) == [] for r in rows[:-1])


def test_conditional_acceptance_divides_each_position_by_the_one_before() -> None:
    cb = {p["title"]: p for p in panels(DASHBOARDS["dashboards/cycle-breakdown.json"])}
    expr = cb["Conditional acceptance by draft position"]["targets"][0]["expr"]
    terms = expr.split("\nor\n")
    assert len(terms) == 8
    assert catalog.DRAFTED_BY_POSITION.name + '{' in terms[0]
    for i, term in enumerate(terms[1:], start=1):
        num, _, den = term.partition("\n  /\n")
        assert f'position="{i}"' in num and f'position="{i - 1}"' in den, term
        assert f'"position", "{i}"' in term


def test_cycle_breakdown_has_the_issue_panels() -> None:
    titles = [p["title"] for p in panels(DASHBOARDS["dashboards/cycle-breakdown.json"])]
    for needle in (
        "by phase (GPU clock)", "by phase (host clock)", "Phase share", "p50 / p90 / p99",
        "heatmap", "Acceptance rate", "excl. bonus", "by draft position",
        "Accept-length distribution", "Batch size", "tokens/s per server", "per sequence",
        "realized vs predicted", "Dropped", "sampled", "CPU", "Conditional acceptance",
        "Rejected draft tokens/s",
    ):  # fmt: skip
        assert any(needle in t for t in titles), needle


def test_fleet_has_the_issue_panels() -> None:
    fleet = DASHBOARDS["dashboards/fleet.json"]
    table = next(p for p in panels(fleet) if p["type"] == "table")
    headers = [t["legendFormat"] for t in table["targets"]]
    assert headers == [
        "Up", "Tokens/s", "Speedup", "Acceptance", "Mean k", "Mean batch", "p99 cycle",
        "Verify share", "Last cycle age", "Firing alerts",
    ]  # fmt: skip
    assert all(t["instant"] and t["format"] == "table" for t in table["targets"])
    titles = " | ".join(p["title"] for p in panels(fleet))
    for needle in (
        "Slowest",
        "Lowest",
        "Highest",
        "by model_name",
        "by serving_engine",
        "across the fleet",
    ):
        assert needle in titles, needle
    assert sum(p["type"] == "stat" for p in panels(fleet)) >= 4


def _latency_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        p
        for p in panels(dashboard)
        if p["type"] in ("timeseries", "heatmap")  # a stat's one number has no exemplars
        and not any(_engine_series(t["expr"]) for t in p["targets"])  # nor the engine's own
        and any("_seconds_bucket" in t["expr"] for t in p["targets"])
        and "rate(" in "".join(t["expr"] for t in p["targets"])
        # The time between cycles is no traced cycle: its histogram carries no exemplars.
        and not any(f"{catalog.CYCLE_GAP.name}_bucket" in t["expr"] for t in p["targets"])
    ]


def test_latency_panels_show_exemplars_and_link_traces_only_when_configured() -> None:
    plain = _latency_panels(DASHBOARDS["dashboards/cycle-breakdown.json"])
    assert len(plain) >= 3
    for panel in plain:
        assert all(t["exemplar"] for t in panel["targets"]), panel["title"]
        assert not panel["fieldConfig"]["defaults"].get("links"), panel["title"]
    traced = _load(MixinConfig(trace_datasource_uid="tempo-uid"))
    for panel in _latency_panels(traced["dashboards/cycle-breakdown.json"]):
        links = panel["fieldConfig"]["defaults"]["links"]
        assert links and "tempo-uid" in links[0]["url"], panel["title"]
