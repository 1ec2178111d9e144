"""The engines' own series table (specobs/mixin/_engines.py): every series a transform reads is
one the table lists for that engine, the fixtures serve each engine's exposition as the table
says (parsed back by prometheus_client, the library four of the five engines write it with),
and docs/integrations.md holds the table as generated."""

from __future__ import annotations

from pathlib import Path

import pytest

from specobs.mixin import _engines, _splice, render_regions
from specobs.mixin._config import MixinConfig
from specobs.mixin._rules import RuleNames, recording_rules
from tests._engine_exposition import EngineExposition, Workload, workload_figures

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("engine", _engines.ENGINES, ids=lambda e: e.name)
def test_every_series_a_transform_reads_is_in_the_engines_table(engine: _engines.Engine
                                                                 ) -> None:
    listed = {m.name: m for m in engine.metrics}
    for t in engine.transforms:
        for name in _engines.template_series(t.template):
            assert name in listed, (engine.name, t.quantity, name)
            # A rate over a counter, a mean over a gauge: never the other way round.
            kind = "rate" if listed[name].type == _engines.COUNTER else "gauge"
            assert (f"{{{kind}:{name}" in t.template or f"{{rate_pos:{name}" in t.template), (
                engine.name, t.quantity, name)
    for name in engine.request_gauges:
        assert listed[name].type == _engines.GAUGE, name
    assert {t.quantity for t in engine.transforms} <= {q.key for q in _engines.QUANTITIES}


def test_one_rule_per_quantity_with_every_engine_that_gives_it() -> None:
    rules = {r.record: r.expr for r in recording_rules(MixinConfig())}
    for q in _engines.QUANTITIES:
        expr = rules[RuleNames(MixinConfig()).engine[q.key]]
        for engine in _engines.ENGINES:
            t = engine.transform(q.key)
            assert (f'"serving_engine", "{engine.name}"' in expr) == (t is not None), (
                q.key, engine.name)


@pytest.mark.parametrize("engine", _engines.ENGINES, ids=lambda e: e.name)
def test_the_fixture_serves_the_engines_exposition_as_the_table_says(
    engine: _engines.Engine,
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    server = EngineExposition(engine.name, Workload(k=2, position_acceptance=(0.7, 0.4)),
                              latency=False)
    try:
        text = server.exposition()
    finally:
        server.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for metric in engine.metrics:
        # prometheus_client names a counter's family without its _total.
        family = families[metric.name.removesuffix("_total") if metric.type == "counter"
                          else metric.name]
        assert (family.type, family.documentation) == (metric.type, metric.help), metric.name
        for sample in family.samples:
            assert sample.name == metric.name, sample
            assert set(sample.labels) == set(metric.labels), (metric.name, sample.labels)
    assert len(families) == len(engine.metrics)
    figures = workload_figures(engine.name, Workload(k=2, position_acceptance=(0.7, 0.4)))
    assert figures["acceptance"] == pytest.approx(0.55)
    assert (figures["acceptance_by_position"] is None) == (
        engine.transform("acceptance_by_position") is None)


def test_integrations_doc_holds_the_generated_engine_table() -> None:
    current = (ROOT / "docs" / "integrations.md").read_text()
    region = render_regions()["docs/integrations.md#engine-series"]
    assert _splice(current, region) == current, "run: python3 -m specobs.cli generate"
    for engine in _engines.ENGINES:
        assert engine.source in region
        for t in engine.transforms:
            for name in _engines.template_series(t.template):
                assert f"`{name}`" in region, name
    for rule in RuleNames(MixinConfig()).engine.values():
        assert f"`{rule}`" in region
