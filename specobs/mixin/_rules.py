"""Prometheus recording and alert rules, generated from the catalog and a :class:`MixinConfig`.

Recording rules are named ``level:metric:operations``. Every ``instance:`` rule aggregates to one
series per server (``job, instance`` plus the model and engine constant labels), so the fleet
dashboard and the alerts read a handful of precomputed series instead of raw histograms.

Alerts are CamelCase with the prefix ``Specobs``; each has a ``severity`` label, a static
``summary``, a templated ``description`` and a ``runbook_url`` into docs/runbook.md.

The rules themselves are tables in :mod:`specobs.mixin._recording_rules` and
:mod:`specobs.mixin._alert_rules`, their names in :mod:`specobs.mixin._rule_names`. This module
reads them: what each alert depends on, how soon it can fire, and how the rules split into
groups for the rule file.
"""

from __future__ import annotations

import re
from typing import Any

import specobs.catalog as c
from specobs.mixin._alert_rules import alert_rules
from specobs.mixin._config import MixinConfig, duration_seconds, generated_notice
from specobs.mixin._promql import history_name
from specobs.mixin._recording_rules import recording_rules
from specobs.mixin._rule_names import (
    ALERT_PREFIX,
    ENGINE_REQUEST_GAUGES,
    AlertNames,
    AlertRule,
    RecordingRule,
    RuleNames,
)

__all__ = [
    "ALERT_PREFIX",
    "ENGINE_REQUEST_GAUGES",
    "AlertNames",
    "RuleNames",
    "alert_chain_links",
    "alert_inputs",
    "alert_reads",
    "alert_rules",
    "detection_seconds",
    "history_name",
    "history_rules",
    "recording_rules",
    "render",
    "rule_cost",
    "rule_groups",
]


def _str_presenter(dumper: Any, data: str) -> Any:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


def dump_yaml(data: Any) -> str:
    """YAML with multi-line strings as literal blocks, keys in the order given."""
    # pyyaml (the ``gen`` extra) is imported here: fleet-sim reads the alert names of this
    # module without it.
    import yaml

    class Dumper(yaml.SafeDumper):  # type: ignore[misc]
        pass

    Dumper.add_representer(str, _str_presenter)
    return str(yaml.dump(data, Dumper=Dumper, sort_keys=False, width=1000, allow_unicode=True))


_RANGE = re.compile(r"\b(?:rate|increase)\([^()\[]*\[([0-9a-z]+)\]\)")
_RULE_NAME = re.compile(r"\b(?:instance|cohort|host):[A-Za-z0-9_]+:[A-Za-z0-9_]+")


def _reads(expr: str) -> set[str]:
    """The recording rules an expression reads (every ``level:metric:operations`` name)."""
    return set(_RULE_NAME.findall(expr))


def history_rules(config: MixinConfig) -> list[RecordingRule]:
    """The recorded ``history_step`` averages the history alerts read (``_past``), in the order
    of :func:`recording_rules`; their own group is evaluated every ``history_step``."""
    read = {m for a in alert_rules(config) for m in _reads(a.expr)}
    return [
        RecordingRule(history_name(r.record, config),
                      f"avg_over_time({r.record}[{config.history_step}])")
        for r in recording_rules(config)
        if history_name(r.record, config) in read
    ]  # fmt: skip


def _closure(names: set[str], rules: dict[str, str]) -> frozenset[str]:
    wanted = {n for n in names if n in rules}
    while True:
        more = {m for name in wanted for m in _reads(rules[name]) if m in rules} - wanted
        if not more:
            return frozenset(wanted)
        wanted |= more


def alert_reads(config: MixinConfig) -> dict[str, frozenset[str]]:
    """Alert -> the recording rules it reads at its own evaluation, directly or through another
    recording rule. Not included, by design: a history alert's ``history_step`` averages
    (:func:`history_rules`), which it reads only ``history_offset`` in the past, so they may come
    from a group of their own, evaluated every ``history_step``."""
    rules = {r.record: r.expr for r in recording_rules(config)}
    return {a.alert: _closure(_reads(a.expr), rules) for a in alert_rules(config)}


def alert_inputs(config: MixinConfig) -> frozenset[str]:
    """The recording rules some alert reads at its own evaluation (see :func:`alert_reads`)."""
    return frozenset().union(*alert_reads(config).values())


def alert_chain_links(config: MixinConfig) -> dict[str, int]:
    """Alert -> the recording rules on its longest chain from the raw series (0: it reads only
    raw series). A ruler that sees its own results only after writing them to the store
    (vmalert on VictoriaMetrics) sees each link one evaluation late."""
    rules = {r.record: r.expr for r in recording_rules(config)}
    depth: dict[str, int] = {}
    for record, expr in rules.items():  # evaluation order: inputs come first
        depth[record] = 1 + max((depth[m] for m in _reads(expr) if m in rules), default=0)
    return {
        a.alert: max((depth[m] for m in _reads(a.expr) if m in rules), default=0)
        for a in alert_rules(config)
    }


def detection_seconds(
    config: MixinConfig,
    scrape_interval_seconds: float,
    evaluation_interval_seconds: float,
    *,
    link_seconds: float = 0.0,
) -> dict[str, float]:
    """Alert -> the latest it fires after a fault large enough to cross its threshold once the
    fault fills its window: one scrape until the fault is in a sample, the alert's window (the
    rate window when it reads a rate; ``stall_after`` for the stall alert; none for ``up``),
    one evaluation, then ``for``. ``link_seconds``: what each link of the chain to the raw
    series adds (:func:`alert_chain_links` plus one, the raw series' own way into the store);
    0 for Prometheus, whose rules read the rules of their own evaluation; for vmalert, its
    evaluation interval plus VictoriaMetrics' ``-search.latencyOffset``."""
    rules = {r.record: r.expr for r in recording_rules(config)}
    reads = alert_reads(config)
    links = alert_chain_links(config)
    out = {}
    for a in alert_rules(config):
        exprs = [a.expr, *(rules[m] for m in reads[a.alert])]
        # The longest range a rate() or increase() reads (the rate window; the request window).
        window = max((duration_seconds(w) for e in exprs for w in _RANGE.findall(e)),
                     default=0.0)
        stall = re.search(r"time\(\) - \S+ <= ([0-9.]+)", a.expr)
        if stall:
            window = max(window, float(stall.group(1)))
        out[a.alert] = (
            scrape_interval_seconds + window + evaluation_interval_seconds
            + duration_seconds(a.for_) + (links[a.alert] + 1) * link_seconds
        )  # fmt: skip
    return out


#: Label values per server, for :func:`rule_cost` (the default phases; ``le`` comes from the
#: metric's buckets, an accept-length histogram has k + 2 of them, about 8).
_LABEL_VALUES = {"phase": 3, "clock": 2, "reason": len(c.DROP_REASONS), "position": 6}
_RAW_SELECTOR = re.compile(r"(?<![\w:])([a-z_][a-z0-9_]*)\{([^}]*)\}(\[[^\]]+\])?")


def _series_per_server(name: str, matchers: str) -> int:
    """How many series of one server a selector matches, from the catalog's labels."""
    metric = c.by_prometheus_name().get(name)
    if metric is None:  # up, the engines' own gauges
        return 1
    fixed = set(re.findall(r'([a-z_]+)="', matchers))
    n = 1
    for label in metric.labels:
        if label not in fixed:
            n *= _LABEL_VALUES.get(label, 1)
    if name.endswith("_bucket"):
        n *= len(metric.buckets) + 1 if metric.buckets else 8
    return n


def rule_cost(expr: str) -> int:
    """A rough cost of one evaluation, per server: series read through a range (``rate``) count
    20 (samples in 5 minutes at a 15 s scrape), series read at one instant and recording rules
    read count 1. It orders and packs the dashboards' rules; what a rule really costs is
    measured by benchmarks/fleet.py."""
    cost = 0
    for name, matchers, window in _RAW_SELECTOR.findall(expr):
        if name in ("by", "without", "on", "ignoring", "group_left", "group_right"):
            continue
        cost += _series_per_server(name, matchers) * (20 if window else 1)
    return cost + len(_reads(expr))


def _alert_components(config: MixinConfig) -> list[tuple[list[AlertRule], frozenset[str]]]:
    """Alerts joined into components: two alerts that read a common recording rule share one."""
    reads = alert_reads(config)
    components: list[tuple[list[AlertRule], frozenset[str]]] = []
    for alert in alert_rules(config):
        members, needs = [alert], reads[alert.alert]
        for other in [comp for comp in components if comp[1] & needs]:
            components.remove(other)
            members, needs = other[0] + members, other[1] | needs
        components.append((members, needs))
    order = {a.alert: i for i, a in enumerate(alert_rules(config))}
    return sorted(components, key=lambda comp: min(order[a.alert] for a in comp[0]))


def _kebab(alert: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", alert.removeprefix(ALERT_PREFIX)).lower()


def rule_groups(config: MixinConfig) -> dict[str, Any]:
    """The rule groups, which Prometheus (and vmalert) evaluate concurrently, each in rule order.

    *Alert groups*: the alerts split into components that share no recording rule, each group
    holding its alerts and, first, every recording rule they read. Rules of a group run in order
    at the same timestamp, so every alert reads the recording rules of its own evaluation
    (across groups it might read values one interval old, and detection times would wobble).
    The first is ``specobs``; the others are named after their first alert.
    ``specobs-history``, every ``history_step``: the averages the history alerts read
    ``history_offset`` in the past, deliberately from another group.
    ``specobs-dashboards`` (and ``-2``, ...): the recording rules only dashboards read, which may
    read the alert groups' series one interval old, packed by :func:`rule_cost` into as many
    groups as it takes for none to cost more than the costliest alert group.
    Split, the work of one evaluation runs on every core instead of one.
    """
    recording = recording_rules(config)
    groups: list[dict[str, Any]] = []
    alert_costs = []
    for i, (alerts, needs) in enumerate(_alert_components(config)):
        rules = [r for r in recording if r.record in needs]
        alert_costs.append(sum(rule_cost(r.expr) for r in rules)
                           + sum(rule_cost(a.expr) for a in alerts))  # fmt: skip
        groups.append({
            "name": "specobs" if i == 0 else f"specobs-{_kebab(alerts[0].alert)}",
            "rules": [{"record": r.record, "expr": r.expr} for r in rules]
            + [
                {
                    "alert": a.alert,
                    "expr": a.expr,
                    "for": a.for_,
                    "labels": {"severity": a.severity},
                    "annotations": {
                        "summary": a.summary,
                        "description": a.description,
                        "runbook_url": f"{config.runbook_base_url}#{a.anchor}",
                    },
                }
                for a in alerts
            ],
        })  # fmt: skip
    history = history_rules(config)
    if history:
        groups.append({
            "name": "specobs-history",
            "interval": config.history_step,
            "rules": [{"record": r.record, "expr": r.expr} for r in history],
        })  # fmt: skip
    inputs = alert_inputs(config)
    rest = [r for r in recording if r.record not in inputs]
    # Components of the dashboards' rules (a rule with the rules it reads), packed costliest
    # first into the group that costs least so far.
    exprs = {r.record: r.expr for r in rest}
    parts: list[set[str]] = []
    for r in rest:
        part = set(_closure({r.record}, exprs))
        for other in [p for p in parts if p & part]:
            parts.remove(other)
            part |= other
        parts.append(part)
    cost = {r.record: rule_cost(r.expr) for r in rest}
    budget = max(alert_costs, default=1)
    total = sum(cost.values())
    bins: list[set[str]] = [set() for _ in range(max(1, -(-total // budget)))]
    for part in sorted(parts, key=lambda p: (-sum(cost[n] for n in p), sorted(p))):
        min(bins, key=lambda b: sum(cost[n] for n in b)).update(part)
    for i, names in enumerate(b for b in bins if b):
        groups.append({
            "name": "specobs-dashboards" + (f"-{i + 1}" if i else ""),
            "rules": [{"record": r.record, "expr": r.expr} for r in rest if r.record in names],
        })  # fmt: skip
    return {"groups": groups}


def render(config: MixinConfig) -> str:
    """The rule file ``deploy/prometheus/rules/specobs-rules.yml``."""
    return f"# {generated_notice()}\n" + dump_yaml(rule_groups(config))
