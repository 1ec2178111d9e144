"""PromQL pieces the recording and alert rules are built from.

Each helper returns one expression as text, laid out as the rule file shows it. Selectors are
joined with :func:`selector`, so no expression writes a label set inside an f-string.
"""

from __future__ import annotations

import specobs.catalog as c
from specobs.mixin import _engines
from specobs.mixin._config import MixinConfig
from specobs.mixin._rule_names import BASELINE_CONFIGURED, ENGINE_SOURCE

__all__ = [
    "baseline_expr",
    "engine_rule_expr",
    "histogram_mean",
    "history_name",
    "on_host",
    "past",
    "plugin_or_engine",
    "rate",
    "ratio",
    "request_low_share_expr",
    "selector",
]


def selector(name: str, matchers: str) -> str:
    """``name{matchers}``: a series selector."""
    return name + "{" + matchers + "}"


def rate(metric: str, config: MixinConfig, by: str, matchers: str = "") -> str:
    """The summed rate of ``metric`` over the rate window, by ``by``."""
    labels = f"{config.selector}, {matchers}" if matchers else config.selector
    return f"sum by ({by}) (rate({selector(metric, labels)}[{config.rate_window}]))"


def ratio(num: str, den: str) -> str:
    """``num / den`` where the denominator is positive: an idle server has no series, not NaN."""
    return f"{num}\n/\n({den} > 0)"


def histogram_mean(histogram: str, config: MixinConfig, by: str, matchers: str = "") -> str:
    """A histogram's mean over the rate window: the rate of its sum over that of its count."""
    return ratio(rate(f"{histogram}_sum", config, by, matchers),
                 rate(f"{histogram}_count", config, by, matchers))


def plugin_or_engine(plugin: str, engine_rule: str) -> str:
    """A fleet series from specobs's plugin, or else from the engine's own series. The engine
    rule drops every host where the plugin is scraped, so "or" adds servers and never counts
    one twice."""
    return f"{plugin}\nor\n{engine_rule}"


def request_low_share_expr(config: MixinConfig, by: str) -> str:
    """The share of finished requests with acceptance <= ``request_acceptance_low`` over
    ``request_window``, by ``by``: the bucket's rate over the count's."""
    sel, window = config.selector, config.request_window
    low = f'le="{float(config.request_acceptance_low)!r}"'
    name = c.REQUEST_ACCEPTANCE.name
    bucket = selector(f"{name}_bucket", f"{sel}, {low}")
    count = selector(f"{name}_count", sel)
    return (
        f"sum by ({by}) (rate({bucket}[{window}]))\n/\n"
        f"(sum by ({by}) (rate({count}[{window}])) > 0)"
    )


def on_host(expr: str) -> str:
    """``expr`` with a ``host`` label: ``instance`` without its port. The engine's own endpoint
    (vLLM's API port) and specobs's (9477) of one pod or machine share it."""
    return f'label_replace({expr}, "host", "$1", "instance", "(.+):[0-9]+")'


def engine_rule_expr(config: MixinConfig, quantity: str) -> str:
    """One normalising rule: every engine's transform of ``quantity`` labelled with its engine
    and ``source="engine"``, less the hosts where specobs's plugin is scraped (its series win)."""
    union = _engines.union(quantity, by=config.by, selector=config.engine_selector,
                           window=config.rate_window, engine_label=config.engine_label,
                           source=ENGINE_SOURCE)
    if union is None:
        raise ValueError(f"no engine gives the fleet quantity {quantity!r}")
    hosted = on_host(f"(\n{union}\n)")
    return (
        f"label_replace(\n{hosted}\n"
        f"# specobs's plugin wins where it is scraped on the same host.\n"
        f"unless on ({config.host_by}) {on_host(selector('up', config.selector))}\n"
        f', "host", "", "host", ".*")'
    )


def baseline_expr(config: MixinConfig, by: str | None = None) -> str:
    """The non-speculative baseline per server with its ``source`` label (``configured`` where
    the exporter gave none); the dashboards use it with ``by="instance"``."""
    gauge = selector(c.BASELINE_SEQUENCE_TOKENS.name, config.selector)
    return (
        f"max by ({config.by if by is None else by}, source) (\n"
        f'  label_replace({gauge}, "source", "{BASELINE_CONFIGURED}", "source", "")\n)'
    )


def history_name(record: str, config: MixinConfig) -> str:
    """The recorded ``history_step`` average of a recording rule: ``level:metric:avg5m_ops``
    (operations newest first, as in ``ratio_rate5m``)."""
    level, metric, ops = record.split(":")
    return f"{level}:{metric}:avg{config.history_step}_{ops}"


def past(record: str, config: MixinConfig) -> str:
    """The recent past of a recording rule: the average of its recorded ``history_step``
    averages over ``history_window``, ending ``history_offset`` ago (12 samples per series for
    the default hour, where the rule itself would give 240 at a 15 s evaluation interval)."""
    return (
        f"avg_over_time({history_name(record, config)}[{config.history_window}] "
        f"offset {config.history_offset})"
    )
