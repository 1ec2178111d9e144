"""docs/otel-genai.md cannot drift from the catalog, the OTLP sink or the deploy collector.

Its generated region is what ``specobs._genai_proposal.render()`` gives; every YAML block in it
parses; the proposal's metrics are the catalog's with the catalog's units and instruments; the
collector configuration maps catalog names to proposed ones only; and every specobs name and
``SPECOBS_*`` variable the page mentions exists.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from specobs import catalog
from specobs.mixin import _genai_proposal as proposal
from specobs.mixin import render_regions
from specobs.sinks import _otlp_genai
from specobs.sinks.otlp import OtlpSink

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / proposal.PATH


def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def yaml_blocks(text: str) -> list[Any]:
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def block_with(key: str) -> dict[str, Any]:
    found = [b for b in yaml_blocks(doc()) if isinstance(b, dict) and key in b]
    assert len(found) == 1, f"expected one YAML block with {key!r}, got {len(found)}"
    return found[0]


def test_the_generated_region_is_current() -> None:
    region = render_regions()[proposal.PATH]
    text = doc()
    assert region.rstrip("\n") in text, f"{proposal.PATH} is stale: run `specobs generate`"
    assert text.count(proposal.BEGIN) == 1 and text.count(proposal.END) == 1


def test_every_yaml_block_parses_and_the_generated_ones_are_the_renders() -> None:
    blocks = yaml_blocks(doc())
    assert len(blocks) == 3
    assert yaml.safe_load(proposal.registry_yaml()) == block_with("attributes")
    assert yaml.safe_load(proposal.metrics_yaml()) == block_with("metrics")
    assert yaml.safe_load(proposal.collector_config()) == block_with("processors")


def test_the_registry_snippet_is_in_the_upstream_shape() -> None:
    registry = block_with("attributes")
    assert registry["file_format"] == "definition/2"
    keys = [a["key"] for a in registry["attributes"]]
    assert len(keys) == len(set(keys))
    for attribute in registry["attributes"]:
        assert attribute["key"].startswith("gen_ai.speculative."), attribute["key"]
        assert attribute["stability"] == "development"
        assert attribute["brief"].strip()
        kind = attribute["type"]
        if isinstance(kind, dict):
            members = kind["members"]
            assert members and all(m["stability"] == "development" and m["id"] == m["value"]
                                   for m in members)
        else:
            assert kind in ("int", "string")
            assert attribute["examples"]
            assert all(isinstance(e, int if kind == "int" else str)
                       for e in attribute["examples"])


def test_the_proposed_metrics_are_the_catalogs() -> None:
    metrics = block_with("metrics")
    assert metrics["file_format"] == "definition/2"
    registry_keys = {a["key"] for a in block_with("attributes")["attributes"]}
    by_name = {m.name: m for m in proposal.METRICS}
    assert [m["name"] for m in metrics["metrics"]] == list(by_name)
    for entry in metrics["metrics"]:
        metric = by_name[entry["name"]].metric
        assert entry["name"].startswith("gen_ai.server.speculative.")
        assert entry["stability"] == "development"
        assert entry["instrument"] == metric.kind
        assert entry["unit"] == metric.unit
        refs = [a["ref"] for a in entry["attributes"] if "ref" in a]
        groups = [a["ref_group"] for a in entry["attributes"] if "ref_group" in a]
        assert groups == [proposal.METRIC_ATTRIBUTE_GROUP]
        assert set(refs) <= registry_keys
    for m in proposal.METRICS:
        # Each label of the catalog metric becomes exactly one proposed attribute: nothing is
        # lost, and nothing is invented, when the collector renames.
        assert tuple(label for label, _ in m.attributes) == m.metric.labels, m.name
    for a in proposal.ATTRIBUTES:
        for label in a.labels:
            assert any(label in metric.labels for metric in catalog.CATALOG), label
        for key in a.span_keys:
            assert key in {s.key for s in catalog.SPAN_ATTRIBUTES}, key


def test_every_catalog_metric_and_span_attribute_is_on_the_page() -> None:
    text = doc()
    for metric in catalog.CATALOG:
        assert f"`{metric.name}`" in text, metric.name
    for attribute in catalog.SPAN_ATTRIBUTES:
        assert f"`{attribute.key}`" in text, attribute.key
    assert not (set(proposal.NOT_PROPOSED) & {m.metric.otel_name for m in proposal.METRICS})
    assert set(proposal.NOT_PROPOSED) <= {m.otel_name for m in catalog.CATALOG}


def test_the_collector_config_maps_catalog_names_to_proposed_ones() -> None:
    config = block_with("processors")
    by_otel = {m.otel_name: m for m in catalog.CATALOG}
    proposed = {m["name"] for m in block_with("metrics")["metrics"]}
    registry_keys = {a["key"] for a in block_with("attributes")["attributes"]}
    transforms = config["processors"]["metricstransform/genai"]["transforms"]
    assert {t["new_name"] for t in transforms} == proposed
    for t in transforms:
        metric = by_otel[t["include"]]
        assert (t["match_type"], t["action"]) == ("strict", "insert")
        for op in t.get("operations", []):
            assert op["action"] == "update_label"
            assert op["label"] in metric.labels
            assert op["new_label"] in registry_keys
    transform = config["processors"]["transform/genai"]
    keys_set = [re.findall(r'attributes\["([^"]+)"\]', s)
                for group in transform["metric_statements"] for s in group["statements"]]
    # Each point gets the resource's attribute of the same key: the keys the sink sets.
    assert [k[0] for k in keys_set] == list(_otlp_genai.GENAI_KEYS)
    assert all(k[0] == k[1] for k in keys_set)
    span_keys = {s.key for s in catalog.SPAN_ATTRIBUTES}
    for group in transform["trace_statements"]:
        for statement in group["statements"]:
            new, old = re.findall(r'attributes\["([^"]+)"\]', statement)
            assert new in registry_keys and old in span_keys, statement
    # The pipelines use the genai processors and otherwise only what the deploy config defines.
    deploy = yaml.safe_load((ROOT / "deploy/otel-collector/config.yaml").read_text())
    for name, pipeline in config["service"]["pipelines"].items():
        assert set(pipeline["receivers"]) <= set(deploy["receivers"]), name
        assert set(pipeline["exporters"]) <= set(deploy["exporters"]), name
        assert set(pipeline["processors"]) <= set(deploy["processors"]) | set(
            config["processors"]), name
        assert "transform/genai" in pipeline["processors"]


def _known_name(name: str) -> bool:
    names = {n for m in catalog.CATALOG for n in (m.otel_name, m.name)}
    names |= set(catalog.by_prometheus_name())
    names |= {s.key for s in catalog.SPAN_ATTRIBUTES} | {catalog.CYCLE_SPAN_NAME}
    if name in names:
        return True
    module, _, attribute = name.rpartition(".")
    for candidate, attr in ((name, ""), (module, attribute)):
        if not candidate.startswith("specobs."):
            continue
        try:
            found = importlib.import_module(candidate)
        except ImportError:
            continue
        return not attr or hasattr(found, attr)
    return False


def test_every_specobs_name_on_the_page_exists() -> None:
    text = doc()
    names = set(re.findall(r"\bspecobs[._][A-Za-z0-9_.]*[A-Za-z0-9_]", text))
    assert names
    unknown = sorted(n for n in names if not _known_name(n))
    assert not unknown, f"names on {proposal.PATH} that specobs does not have: {unknown}"


def test_the_settings_on_the_page_are_the_sinks() -> None:
    text = doc()
    parameters = inspect.signature(OtlpSink).parameters
    for argument, variable, key in _otlp_genai._SETTINGS:
        assert argument in parameters
        assert f"| `{key}`" in text and f"`{argument}`" in text and f"`{variable}`" in text
    package = "\n".join(p.read_text() for p in (ROOT / "specobs").rglob("*.py"))
    for variable in set(re.findall(r"\bSPECOBS_[A-Z_]+\b", text)):
        assert f'{variable} = "{variable}"' in package, f"{variable} is not a specobs variable"


@pytest.mark.parametrize("page", ["README.md", "docs/architecture.md"])
def test_the_page_is_linked(page: str) -> None:
    assert "otel-genai.md" in (ROOT / page).read_text(encoding="utf-8")
