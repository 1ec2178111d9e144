"""The generated mixin: committed files match the generator, rules pass promtool, every series
queried exists in the catalog, alerts and recording rules follow the naming conventions."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from specobs import catalog
from specobs.mixin import OUTPUT_PATHS, MixinConfig, check_all, render_all, write_all
from specobs.mixin._dashboards import ENGINE_LATENCY
from specobs.mixin._engines import metric_names as engine_metric_names
from specobs.mixin._panels import dashboard_queries
from specobs.mixin._rules import (
    ENGINE_REQUEST_GAUGES,
    alert_rules,
    history_rules,
    recording_rules,
)
from specobs.mixin._runbook import entries as runbook_entries
from tests._prometheus_server import promtool
from tests.test_mixin_promql import label_values_query, metric_names

ROOT = Path(__file__).resolve().parent.parent
RULES = "deploy/prometheus/rules/specobs-rules.yml"
RULE_TESTS = "deploy/prometheus/rules/specobs-rules.test.yml"
#: Series Prometheus itself produces, which rules may read, and the engines' own gauges.
PROMETHEUS_SERIES = frozenset({
    "up", "ALERTS", *ENGINE_REQUEST_GAUGES, *engine_metric_names(),
    *(f"{name}_bucket" for _, _, names in ENGINE_LATENCY for name in names),
})


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return render_all()


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every query target's PromQL, those in collapsed rows included."""
    return [expr for _, expr in dashboard_queries(dashboard)]


def all_exprs(files: dict[str, str]) -> dict[str, list[str]]:
    """Source -> every PromQL expression in it (rules, dashboard targets, variable queries)."""
    out: dict[str, list[str]] = {}
    rules = yaml.safe_load(files[RULES])
    out[RULES] = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for path in ("dashboards/cycle-breakdown.json", "dashboards/fleet.json"):
        dashboard = json.loads(files[path])
        exprs = dashboard_exprs(dashboard)
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                exprs.append(label_values_query(variable["query"])[0])
        out[path] = exprs
    return out


# -- drift -------------------------------------------------------------------------------------


def test_committed_files_match_the_generator(rendered: dict[str, str]) -> None:
    drifted = check_all(ROOT)
    assert drifted == [], (
        f"generated files are out of date: {drifted}. Regenerate them with `specobs generate` "
        "(or `python -c 'from specobs.mixin import write_all; write_all(\".\")'`) and commit."
    )
    assert set(rendered) == set(OUTPUT_PATHS)


def test_render_all_is_pure_and_deterministic() -> None:
    first, second = render_all(), render_all(MixinConfig())
    assert first == second
    for path, text in first.items():
        assert text.endswith("\n") and not text.endswith("\n\n"), path
        if path.endswith(".json"):
            assert text == json.dumps(json.loads(text), sort_keys=True, indent=2,
                                      ensure_ascii=False) + "\n", path  # fmt: skip


def test_write_all_then_check_all_round_trips(tmp_path: Path) -> None:
    assert check_all(tmp_path) == sorted(render_all())
    assert sorted(write_all(tmp_path)) == sorted(render_all())
    assert check_all(tmp_path) == []
    assert write_all(tmp_path) == []
    (tmp_path / "docs/runbook.md").write_text("edited\n")
    assert check_all(tmp_path) == ["docs/runbook.md"]


def test_config_is_validated_with_clear_messages() -> None:
    with pytest.raises(ValueError, match="rate_window must be a Prometheus duration"):
        MixinConfig(rate_window="5 minutes")
    with pytest.raises(ValueError, match="equality matcher on job"):
        MixinConfig(selector='job=~"spec.*"')
    with pytest.raises(ValueError, match="between 0 and 1"):
        MixinConfig(acceptance_drop_ratio=1.5)


def test_custom_config_changes_names_and_drops_the_default_only_rule_tests(
    tmp_path: Path,
) -> None:
    config = MixinConfig(
        rate_window="1m", selector='job="llm", cluster="eu"', dashboard_prefix="LLM / ",
        uid_prefix="llm-", trace_datasource_uid="tempo",
    )  # fmt: skip
    files = render_all(config)
    assert RULE_TESTS not in files
    assert "instance:specobs_cycles:rate1m" in files[RULES]
    assert 'job="llm", cluster="eu"' in files[RULES]
    fleet = json.loads(files["dashboards/fleet.json"])
    assert fleet["uid"] == "llm-fleet" and fleet["title"] == "LLM / fleet"
    assert "instance:specobs_cycles:rate1m" in files["dashboards/fleet.json"]
    (tmp_path / "rules.yml").write_text(files[RULES])
    result = promtool("check", "rules", tmp_path / "rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_grouping_and_labels_are_configurable_and_carried_everywhere() -> None:
    config = MixinConfig(group_labels=("region", "cluster"), server_labels=("pod", "node"),
                         model_label="model", engine_label="engine_name")  # fmt: skip
    files = render_all(config)
    rules = yaml.safe_load(files[RULES])
    for group in rules["groups"]:
        for rule in group["rules"]:
            expr = rule["expr"]
            for by in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr):
                labels = {x.strip() for x in by.split(",")}
                if labels & {"job", "instance", "host"} and "le" not in labels:
                    assert {"region", "cluster"} <= labels, (rule.get("record"), by)
    for path in ("dashboards/fleet.json", "dashboards/cycle-breakdown.json"):
        dashboard = json.loads(files[path])
        names = [v["name"] for v in dashboard["templating"]["list"]]
        assert names[:3] == ["datasource", "region", "cluster"], names
        for expr in dashboard_exprs(dashboard):
            assert 'region=~"$region"' in expr and 'cluster=~"$cluster"' in expr, expr
    with pytest.raises(ValueError, match="tuple of label names"):
        MixinConfig(group_labels="cluster")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must not repeat"):
        MixinConfig(group_labels=("instance",))


# -- promtool ----------------------------------------------------------------------------------


def test_promtool_check_rules_is_clean() -> None:
    result = promtool("check", "rules", ROOT / RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    assert "WARNING" not in result.stdout + result.stderr


def test_promtool_test_rules_passes(tmp_path: Path) -> None:
    # Copy both files: promtool resolves rule_files relative to the test file.
    for path in (RULES, RULE_TESTS):
        shutil.copy(ROOT / path, tmp_path)
    result = promtool("test", "rules", tmp_path / Path(RULE_TESTS).name)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("phase_seconds", [0, 90, 180, 270])
def test_promtool_test_rules_pass_with_the_history_group_evaluated_every_5m(
    rendered: dict[str, str], tmp_path: Path, phase_seconds: int
) -> None:
    """promtool 2.42 evaluates every group at the tests' 30 s, whatever the group's interval;
    Prometheus evaluates ``specobs-history`` every 5 minutes, at a phase of its own. Thinned to
    one evaluation in ten at each phase, the history averages are what Prometheus records, and
    every case must still pass."""
    from specobs.mixin._config import duration_seconds

    rules = yaml.safe_load(rendered[RULES])
    thinned = [g for g in rules["groups"] if "interval" in g]
    assert [g["name"] for g in thinned] == ["specobs-history"]
    for group in thinned:
        step = duration_seconds(group.pop("interval"))
        assert step == 300
        for rule in group["rules"]:
            rule["expr"] = (
                f"({rule['expr']})\nand on () (vector(time()) % {step:g} == {phase_seconds})"
            )
    (tmp_path / Path(RULES).name).write_text(yaml.safe_dump(rules))
    (tmp_path / Path(RULE_TESTS).name).write_text(rendered[RULE_TESTS])
    result = promtool("test", "rules", tmp_path / Path(RULE_TESTS).name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_silent_case(rendered: dict[str, str]) -> None:
    tests = yaml.safe_load(rendered[RULE_TESTS])["tests"]
    fires: set[str] = set()
    silent: set[str] = set()
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (fires if case["exp_alerts"] else silent).add(case["alertname"])
    alerts = {a.alert for a in alert_rules(MixinConfig())}
    assert fires == alerts
    assert silent == alerts
    names = [t["name"] for t in tests]
    assert any("load drop" in n and "no throughput drop" in n for n in names)


def test_promtool_test_rules_bites_a_naive_tokens_per_second_alert(tmp_path: Path) -> None:
    """The load-drop case really is a load drop: an alert on raw tokens/s would fire on it."""
    rules = yaml.safe_load((ROOT / RULES).read_text())
    alert = next(
        r
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert") == "SpecobsDecodeThroughputDrop"
    )
    alert["expr"] = (
        "instance:specobs_emitted_tokens:rate5m\n"
        "< 0.7 * avg_over_time(instance:specobs_emitted_tokens:rate5m[1h] offset 10m)"
    )
    (tmp_path / "specobs-rules.yml").write_text(yaml.safe_dump(rules))
    shutil.copy(ROOT / RULE_TESTS, tmp_path)
    result = promtool("test", "rules", tmp_path / Path(RULE_TESTS).name)
    assert result.returncode != 0
    failures = result.stdout + result.stderr
    assert "load drop (fewer requests, far fewer tokens/s): no throughput drop" in failures


def test_dashboard_expressions_parse_in_prometheus_2_42(
    rendered: dict[str, str], tmp_path: Path
) -> None:
    exprs = [e for path, es in all_exprs(rendered).items() if path != RULES for e in es]
    substitutions = {
        "$__rate_interval": "1m", "$job": "specobs", "$instance": ".+", "$model": ".*",
        "$serving_engine": ".*", "$cluster": ".*", "$namespace": ".*",
    }  # fmt: skip
    rules = []
    for i, expr in enumerate(exprs):
        for var, value in substitutions.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:expr_{i}:test", "expr": expr})
    path = tmp_path / "dashboards.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


# -- every series exists -----------------------------------------------------------------------


def test_every_series_queried_is_in_the_catalog_or_a_recording_rule(
    rendered: dict[str, str],
) -> None:
    known = set(catalog.by_prometheus_name())
    recorded = {r.record for r in [*recording_rules(MixinConfig()), *history_rules(MixinConfig())]}
    problems = []
    for source, exprs in all_exprs(rendered).items():
        assert exprs, source
        for expr in exprs:
            # PromQL comments (the engine rules say what each engine's figure means) hold words.
            expr = re.sub(r"(?m)^#.*$", "", expr)
            names = metric_names(expr) - {""}
            for regex in re.findall(r'__name__=~"([^"]+)"', expr):
                names |= set(regex.split("|"))
            assert names, f"{source}: no series found in {expr!r}"
            unknown = names - known - recorded - PROMETHEUS_SERIES
            if unknown:
                problems.append(f"{source}: {sorted(unknown)} in {expr!r}")
    assert problems == []


def test_every_catalog_metric_is_shown_somewhere(rendered: dict[str, str]) -> None:
    used = {
        name for exprs in all_exprs(rendered).values() for e in exprs for name in metric_names(e)
    }
    by_name = catalog.by_prometheus_name()
    # Also series read through a {__name__=~"a|b"} selector (the stall alert's request gauges).
    text = "\n".join(e for exprs in all_exprs(rendered).values() for e in exprs)
    used |= {name for name in by_name if re.search(rf"[\"|]{name}[\"|]", text)}
    shown = {by_name[name].otel_name for name in used if name in by_name}
    missing = {m.otel_name for m in catalog.CATALOG} - shown
    assert missing == set()


# -- naming conventions ------------------------------------------------------------------------


def test_recording_rules_are_named_level_metric_operations() -> None:
    rules = [*recording_rules(MixinConfig()), *history_rules(MixinConfig())]
    names = [r.record for r in rules]
    assert len(names) == len(set(names))
    for name in names:
        assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", name), name
        assert name.startswith(("instance:specobs_", "cohort:specobs_", "host:specobs_")), name
    # Read in evaluation order: a rule only reads rules defined before it.
    defined: set[str] = set()
    for rule in rules:
        assert metric_names(rule.expr) & set(names) <= defined, rule.record
        defined.add(rule.record)


def test_alerts_follow_the_conventions(rendered: dict[str, str]) -> None:
    runbook = rendered["docs/runbook.md"]
    anchors = {heading.lower() for heading in re.findall(r"^## (\S+)$", runbook, flags=re.M)}
    rules = [
        r for g in yaml.safe_load(rendered[RULES])["groups"] for r in g["rules"] if "alert" in r
    ]
    assert len(rules) == len(runbook_entries())
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"Specobs(?:[A-Z][a-z0-9]+)+", name), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        annotations = rule["annotations"]
        assert "{{" not in annotations["summary"], name
        assert "{{ $labels." in annotations["description"], name
        url = annotations["runbook_url"]
        assert url.startswith(MixinConfig().runbook_base_url + "#")
        assert url.split("#")[1] in anchors, name
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
        labels = set(re.findall(r"\$labels\.(\w+)", annotations["description"]))
        assert labels, name


def test_alerts_cover_the_issue(rendered: dict[str, str]) -> None:
    rules = {r.alert: r.expr for r in alert_rules(MixinConfig())}
    assert set(rules) == {
        "SpecobsAcceptanceBelowCohort", "SpecobsAcceptanceRateDrop",
        "SpecobsDecodeThroughputBelowCohort", "SpecobsCohortThroughputDrop",
        "SpecobsDecodeThroughputDrop", "SpecobsSpeculationSlowerThanBaseline",
        "SpecobsPhaseLatencyAboveCohort", "SpecobsPhaseLatencyRegression",
        "SpecobsDecodingStalled", "SpecobsExporterDown", "SpecobsTargetMissing",
        "SpecobsExporterDroppingRecords", "SpecobsLowAcceptanceRequestsJump",
    }  # fmt: skip
    # Survives pod churn: the cohort alerts never group by instance.
    assert "cohort:specobs_acceptance:ratio_rate5m" in rules["SpecobsAcceptanceRateDrop"]
    # The stall alert reads the engines' own gauges, joined by host.
    assert "host:specobs_engine_requests:max" in rules["SpecobsDecodingStalled"]
    # Throughput is judged per sequence, not by raw tokens/s.
    assert "specobs_sequence_tokens_per_second" in rules["SpecobsDecodeThroughputDrop"]
    assert rules["SpecobsTargetMissing"].startswith("absent(")
    assert "== 0" in rules["SpecobsExporterDown"]


def test_metrics_doc_lists_every_metric_and_rule(rendered: dict[str, str]) -> None:
    doc = rendered["docs/metrics.md"]
    for metric in catalog.CATALOG:
        assert f"`{metric.name}`" in doc and f"`{metric.otel_name}`" in doc
    for rule in [*recording_rules(MixinConfig()), *history_rules(MixinConfig())]:
        assert f"`{rule.record}`" in doc
    assert "E x t_plain / (t_draft + t_verify + t_bookkeeping)" in doc
    assert "E x t_verify / (t_draft + t_verify)" not in doc
    assert "vllm:num_requests_running" in doc and "sglang:num_queue_reqs" in doc


def test_alerts_read_only_rules_of_their_own_group() -> None:
    """Every alert group holds every recording rule its alerts read (directly or through another
    rule), so no alert reads a value one evaluation old; no two groups record the same rule. The
    one read across groups is deliberate: a history alert reads the ``specobs-history``
    averages, and only ``history_offset`` (10m) or more in the past. The dashboards' groups hold
    the rest."""
    from specobs.mixin._config import duration_seconds
    from specobs.mixin._rules import _reads, alert_inputs, alert_reads, rule_groups

    config = MixinConfig()
    groups = rule_groups(config)["groups"]
    by_name = {g["name"]: g for g in groups}
    assert len(by_name) == len(groups)
    history = {r.record for r in history_rules(config)}
    assert by_name["specobs-history"]["interval"] == config.history_step
    assert {r["record"] for r in by_name["specobs-history"]["rules"]} == history
    reads = alert_reads(config)
    recorded_where: dict[str, str] = {}
    alerting = [g for g in groups if any("alert" in r for r in g["rules"])]
    assert alerting[0]["name"] == "specobs"
    for group in groups:
        for rule in group["rules"]:
            if "record" in rule:
                assert rule["record"] not in recorded_where, rule["record"]
                recorded_where[rule["record"]] = group["name"]
    for group in alerting:
        own = {r["record"] for r in group["rules"] if "record" in r}
        alerts = [r for r in group["rules"] if "alert" in r]
        # Recording rules first, then the alerts, and exactly the rules the alerts need.
        assert all("record" in r for r in group["rules"][: len(own)])
        assert own == set().union(*(reads[a["alert"]] for a in alerts)), group["name"]
        for rule in group["rules"]:
            for name in _reads(rule["expr"]):
                if name in history:
                    # Read over history_window, at least history_offset in the past (the
                    # per-request alert reads past its own request_window).
                    reads_at = re.findall(
                        re.escape(f"{name}[{config.history_window}]") + r" offset (\w+)",
                        rule["expr"])
                    assert "alert" in rule and reads_at, (group["name"], name)
                    for offset in reads_at:
                        assert duration_seconds(offset) >= duration_seconds(
                            config.history_offset), (group["name"], name, offset)
                else:
                    assert recorded_where[name] == group["name"], (group["name"], name)
    dashboards = {
        r["record"] for g in groups if g["name"].startswith("specobs-dashboards")
        for r in g["rules"]
    }  # fmt: skip
    assert set(recorded_where) - history - alert_inputs(config) == dashboards
    # The split is real: the phase means, the dropped records and the bucket rates (the
    # costliest raw reads at 1,000 servers) are in three different groups.
    assert len({
        recorded_where["instance:specobs_phase_duration_seconds:mean_rate5m"],
        recorded_where["instance:specobs_exporter_dropped_records:rate5m"],
        recorded_where["instance:specobs_cycle_duration_seconds_bucket:rate5m"],
    }) == 3  # fmt: skip


def test_history_step_must_fit_the_history_window() -> None:
    with pytest.raises(ValueError, match="history_step must not exceed history_window"):
        MixinConfig(history_window="12s", history_offset="4s")
    assert MixinConfig(history_window="12s", history_offset="4s", history_step="2s")
