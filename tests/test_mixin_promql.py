"""Tiny PromQL helpers for the mixin tests: metric names in an expression, and its selectors.

Not a parser: good enough for the expressions specobs generates (validated for real by promtool
and by a real Prometheus in the other tests).
"""

from __future__ import annotations

import re

KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
     "and", "or", "unless", "inf", "nan"}
)  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*")


def _blank(match: re.Match[str]) -> str:
    return " " * len(match.group(0))


def _mask(expr: str) -> str:
    """Blank out strings, label matchers, grouping label lists and range/offset durations,
    keeping positions so callers can index the original expression."""
    masked = _STRING.sub(_blank, expr)
    masked = re.sub(r"\{[^}]*\}", lambda m: "{" + " " * (len(m.group(0)) - 2) + "}", masked)
    masked = _GROUPING.sub(lambda m: m.group(1) + " " * (len(m.group(0)) - len(m.group(1))), masked)
    masked = re.sub(r"\[[^\]]*\]", _blank, masked)
    return masked


def selectors(expr: str) -> list[tuple[str, int, str]]:
    """Every vector selector: (metric name, start offset, matcher text without braces)."""
    masked = _mask(expr)
    out = []
    for match in _IDENT.finditer(masked):
        name = match.group(0)
        if name.lower() in KEYWORDS:
            continue
        rest = masked[match.end() :].lstrip()
        if rest.startswith("(") or re.match(r"(by|without)\b", rest):
            continue  # a function or an aggregation
        matchers = ""
        after = masked[match.end() :]
        if after.startswith("{"):
            end = match.end() + after.index("}")
            matchers = expr[match.end() + 1 : end]
        out.append((name, match.start(), matchers))
    return out


def metric_names(expr: str) -> set[str]:
    return {name for name, _, _ in selectors(expr)}


def label_values_query(query: str) -> tuple[str, str]:
    """``label_values(metric{...}, label)`` -> (``metric{...}``, ``label``)."""
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip(), re.S)
    assert match, f"not a label_values() query: {query!r}"
    return match.group(1), match.group(2)


# -- self-tests of the helpers -----------------------------------------------------------------


def test_metric_names_skips_functions_keywords_labels_and_durations() -> None:
    expr = (
        'sum by (phase, le) (rate(foo_bucket{job=~"$job", le="0.5"}[$__rate_interval]))\n'
        "/ on (job, instance) group_left ()\n"
        "histogram_quantile(0.99, bar:baz:rate5m offset 10m) > 1e-3 * time()\n"
        'unless ignoring (x) absent(up{a="b"}) or vector(1)'
    )
    assert metric_names(expr) == {"foo_bucket", "bar:baz:rate5m", "up"}


def test_selectors_return_their_matchers() -> None:
    found = selectors('rate(a_total{job="x", b=~"y|z"}[5m]) / b')
    assert [(name, matchers) for name, _, matchers in found] == [
        ("a_total", 'job="x", b=~"y|z"'),
        ("b", ""),
    ]


def test_label_values_query() -> None:
    assert label_values_query('label_values(specobs_info{job=~"$job"}, instance)') == (
        'specobs_info{job=~"$job"}',
        "instance",
    )
