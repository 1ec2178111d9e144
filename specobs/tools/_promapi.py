"""Counter deltas from a Prometheus server's HTTP API, for ``specobs top --prometheus`` and
``specobs report --prometheus``.

:func:`prometheus_delta` runs one ``increase(...[window])`` instant query per counter series the
catalog defines (and reads the gauges as they are), all evaluated at the same instant, into the
same :class:`~specobs.tools._scrape.Delta` two scrapes make: both sources share one breakdown
(:mod:`specobs.tools._breakdown`). Every failure is a :class:`ScrapeError` with one line for the
user; the HTTP side, its deadline and its httpx → ScrapeError mapping are
:func:`specobs.tools._client.get`'s, the one place that mapping is made.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

from specobs import catalog
from specobs.tools import _client
from specobs.tools._client import Limits, ScrapeError
from specobs.tools._scrape import COUNTER_SERIES, Delta, Series

__all__ = ["NoPluginSeries", "normalize_selector", "parse_window", "prometheus_delta",
           "server_selector", "window_text"]


class NoPluginSeries(ScrapeError):
    """Prometheus answered, but holds no series of specobs's plugin for the selector (the
    servers may still export their engine's own series)."""

# -- Prometheus as the source ---------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")


def parse_window(text: str) -> float:
    """``"30s"`` / ``"1m"`` / ``"500ms"`` → seconds; raises ``ValueError``."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ValueError(f"bad window {text!r}; expected a Prometheus duration such as 30s or 1m")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]
    if value <= 0:
        raise ValueError(f"window must be positive, got {text!r}")
    return value


def server_selector(selector: str, instance: str | None) -> str:
    """The matchers of ``--selector`` and ``--instance`` (``doctor`` and ``advise``) as one
    selector body: the selector normalized, the instance as an exact match."""
    matchers = [normalize_selector(selector)] if selector else []
    if instance is not None:
        matchers.append(f"instance={json.dumps(instance)}")
    return ",".join(m for m in matchers if m)


def normalize_selector(text: str) -> str:
    """``'{job="specobs"}'`` → ``'job="specobs"'`` (the matchers inside); ``ValueError`` if bad."""
    inner = text.strip()
    if not inner:
        return ""
    if not (inner.startswith("{") and inner.endswith("}")):
        raise ValueError(
            f"bad selector {text!r}; expected label matchers in braces, e.g. "
            "'{job=\"specobs\",instance=\"10.0.0.7:9477\"}'"
        )
    return inner[1:-1].strip().rstrip(",")


def window_text(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def prom_query(
    client: Any, base_url: str, promql: str, at: float | None = None,
    limits: Limits = _client.DEFAULT_LIMITS,
) -> list[dict[str, Any]]:
    url = base_url.rstrip("/") + "/api/v1/query"
    shown = _client.display_url(base_url)
    params: dict[str, Any] = {"query": promql}
    if at is not None:
        params["time"] = f"{at:.3f}"
    try:
        response = _client.get(client, url, params=params, limits=limits,
                             headers={"Accept": "application/json"})
    except ScrapeError as exc:
        raise ScrapeError(f"cannot query Prometheus at {shown}: {exc}") from None
    try:
        payload = json.loads(response.body)
    except ValueError:
        raise ScrapeError(
            f"{shown} is not a Prometheus server: /api/v1/query answered HTTP "
            f"{response.status_code} with a non-JSON body"
        ) from None
    if not isinstance(payload, dict) or payload.get("status") != "success":
        error = payload.get("error") if isinstance(payload, dict) else None
        raise ScrapeError(
            f"Prometheus at {shown} rejected {promql!r} (HTTP {response.status_code}): "
            f"{error or 'no error text'}"
        )
    data = payload.get("data") or {}
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("resultType") != "vector" \
            or not isinstance(result, list):
        raise ScrapeError(f"Prometheus at {shown} answered {promql!r} with no vector")
    return result


def _add_result(series: Series, name: str, result: list[dict[str, Any]]) -> None:
    for item in result:
        labels = {k: str(v) for k, v in (item.get("metric") or {}).items() if k != "__name__"}
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if not math.isnan(value):
            series.add(name, labels, value)


def prometheus_delta(
    client: Any, base_url: str, selector: str, window_seconds: float, *,
    limits: Limits = _client.DEFAULT_LIMITS, at: float | None = None,
    extra_gauges: tuple[catalog.Metric, ...] = (),
) -> Delta:
    """Counter deltas over the last ``window_seconds`` from a Prometheus server's ``increase()``.

    ``selector`` is the matchers inside the braces (see :func:`normalize_selector`). Raises
    :class:`ScrapeError` when Prometheus fails or has no specobs series for the selector.
    ``at`` is the Unix time the window ends (default: now). ``extra_gauges`` are read as they
    are at ``at`` besides the info, baseline and sampling gauges (``doctor`` reads the request
    gauges and the last cycle's time).
    """
    window = window_text(window_seconds)
    # Every query is evaluated at the same instant: increase() extrapolates to the window's
    # edges, so series read at different moments would not divide into exact ratios.
    at = time.time() if at is None else at
    counters = Series()
    for name in sorted(COUNTER_SERIES):
        promql = f"increase({name}{{{selector}}}[{window}])"
        _add_result(counters, name, prom_query(client, base_url, promql, at, limits))
    gauges = Series()
    for m in (catalog.INFO, catalog.BASELINE_SEQUENCE_TOKENS, catalog.SAMPLING_INTERVAL,
              catalog.OVERHEAD_RATIO, *extra_gauges):
        promql = f"{m.name}{{{selector}}}"
        _add_result(gauges, m.name, prom_query(client, base_url, promql, at, limits))
    if not gauges.has(catalog.INFO.name):
        raise NoPluginSeries(
            f"Prometheus at {_client.display_url(base_url)} has no "
            f"{catalog.INFO.name}{{{selector}}}: check the selector and that Prometheus scrapes "
            "the specobs endpoint"
        )
    return Delta(counters, gauges, window_seconds)
