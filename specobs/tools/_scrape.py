"""Read a live specobs endpoint for the terminal tools (``specobs top``, ``specobs doctor``).

Three steps, each a plain function of its input so tests can check the arithmetic exactly:

* :func:`fetch_text` / :func:`parse_exposition`: one scrape into a :class:`Series` (samples keyed
  by name and labels). Every failure — refused connection, HTTP error, an HTML page, garbage — is
  a :class:`ScrapeError` with a one-line message; nothing else escapes.
* :func:`difference`: two scrapes into counter deltas over the elapsed seconds, or
  :class:`CounterReset` when any counter went down (the server restarted between polls).
* :func:`breakdown`: deltas into the cycle breakdown (per-phase mean, share, p50/p99 from bucket
  deltas, acceptance, tokens/s, batch size, drops). Numbers are never computed from lifetime
  totals, and every ratio with a zero denominator is ``None`` (shown as "—"), never a division by
  zero.

:func:`prometheus_delta` builds the same deltas from a Prometheus server with ``increase()``, so
both sources share one breakdown.

Metric names come from :mod:`specobs.catalog` only. httpx and prometheus_client are imported
inside the functions that use them: importing this module costs nothing.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from specobs import catalog
from specobs.tools import _http
from specobs.tools._http import Limits, ScrapeError

__all__ = [
    "PHASE_CLOCKS",
    "Breakdown",
    "CounterReset",
    "Delta",
    "Limits",
    "PhaseStats",
    "Scrape",
    "ScrapeError",
    "Series",
    "breakdown",
    "difference",
    "fetch_text",
    "format_rate",
    "format_seconds",
    "histogram_quantile",
    "normalize_url",
    "parse_exposition",
    "prometheus_delta",
    "ratio",
    "scrape",
]

PHASE_CLOCKS: tuple[str, ...] = ("gpu", "host")

#: Accept header that asks prometheus_client for OpenMetrics (exemplars are only sent there).
OPENMETRICS_ACCEPT = "application/openmetrics-text; version=1.0.0; charset=utf-8"

LabelKey = tuple[tuple[str, str], ...]


def _counter_like_names() -> frozenset[str]:
    names: set[str] = set()
    for m in catalog.CATALOG:
        if m.kind == "counter":
            names.add(m.name)
        elif m.kind == "histogram":
            names.update(m.series())
    return frozenset(names)


#: Sample names whose values only ever grow (counters and histogram parts): these are differenced.
COUNTER_SERIES: frozenset[str] = _counter_like_names()


def normalize_url(raw: str, default_path: str = "/metrics") -> str:
    """``host:port`` → ``http://host:port/metrics``; raises ``ValueError`` on a bad scheme/host.

    A URL with a path is kept as given (the exporter may be mounted anywhere); one without gets
    ``default_path``.
    """
    text = raw.strip()
    if not text:
        raise ValueError("empty URL; expected e.g. http://127.0.0.1:9477/metrics")
    if "://" not in text:
        text = f"http://{text}"
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(
            f"unsupported URL scheme {parts.scheme!r} in {raw!r}; expected http:// or https://, "
            f"e.g. http://127.0.0.1:9477/metrics"
        )
    if not parts.hostname:
        raise ValueError(f"no host in {raw!r}; expected e.g. http://127.0.0.1:9477/metrics")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(
            f"bad port in {raw!r}; expected e.g. http://127.0.0.1:9477/metrics"
        ) from None
    if parts.path == "" and default_path:
        text = parts._replace(path=default_path).geturl()
    return text


# -- one scrape -----------------------------------------------------------------------------------


class Series:
    """Samples keyed by ``(name, sorted label pairs)`` with small summing helpers.

    Labels not asked about (job, instance, constant labels such as ``model``) are summed over, so
    an endpoint serving several observers reads as their total.
    """

    __slots__ = ("samples",)

    def __init__(self, samples: Mapping[tuple[str, LabelKey], float] | None = None) -> None:
        self.samples: dict[tuple[str, LabelKey], float] = dict(samples or {})

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.samples[key] = self.samples.get(key, 0.0) + value

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.samples)

    def _matching(self, name: str, match: Mapping[str, str]) -> Iterable[tuple[dict[str, str],
                                                                               float]]:
        for (n, labels), value in self.samples.items():
            if n != name:
                continue
            d = dict(labels)
            if all(d.get(k) == v for k, v in match.items()):
                yield d, value

    def total(self, name: str, **match: str) -> float | None:
        """Sum of the matching series, or ``None`` when there is none."""
        values = [v for _, v in self._matching(name, match)]
        return math.fsum(values) if values else None

    def by(self, name: str, label: str, **match: str) -> dict[str, float]:
        """Sums of the matching series grouped by one label (series without it are skipped)."""
        out: dict[str, float] = {}
        for d, value in self._matching(name, match):
            if label in d:
                out[d[label]] = out.get(d[label], 0.0) + value
        return out

    def labels(self, name: str) -> list[dict[str, str]]:
        return [d for d, _ in self._matching(name, {})]

    def __len__(self) -> int:
        return len(self.samples)


def parse_exposition(text: str) -> Series:
    """Parse Prometheus text (or OpenMetrics) exposition; raises :class:`ScrapeError`."""
    from prometheus_client.parser import text_string_to_metric_families

    stripped = text.lstrip()
    if stripped[:1] == "<":
        raise ScrapeError(
            "the body is HTML, not Prometheus metrics (is the URL the /metrics path?)"
        )
    if "# EOF" in text[-64:]:
        # OpenMetrics: its own parser understands exemplars, units and the EOF marker.
        from prometheus_client.openmetrics.parser import (
            text_string_to_metric_families as openmetrics_families,
        )

        families: Any = openmetrics_families(text)  # type: ignore[no-untyped-call]
    else:
        families = text_string_to_metric_families(text)
    series = Series()
    try:
        for family in families:
            for sample in family.samples:
                value = float(sample.value)
                if math.isnan(value):
                    continue
                series.add(sample.name, sample.labels, value)
    except Exception as exc:  # the parsers raise ValueError, IndexError, KeyError, ...
        # Both parts are cut short: the parser quotes the offending text, which may be huge.
        first = next((line for line in text[:4096].splitlines() if line.strip()), "")
        reason = " ".join(str(exc).split())
        reason = reason if len(reason) <= 100 else reason[:97] + "..."
        raise ScrapeError(
            f"the body is not Prometheus text exposition ({reason}); it starts with "
            f"{first[:60]!r}"
        ) from None
    return series


def fetch_text(
    client: Any, url: str, *, openmetrics: bool = False, limits: Limits = _http.DEFAULT_LIMITS
) -> tuple[str, str]:
    """GET ``url`` within ``limits``; returns ``(body, content type)``. Raises
    :class:`ScrapeError` (see :func:`specobs.tools._http.get`)."""
    headers = {"Accept": OPENMETRICS_ACCEPT} if openmetrics else {"Accept": "text/plain"}
    response = _http.get(client, url, headers=headers, limits=limits)
    if response.status_code != 200:
        body = response.body.decode("utf-8", "replace").strip().splitlines()
        detail = f": {body[0][:80]}" if body else ""
        raise ScrapeError(
            f"{url} answered HTTP {response.status_code} {response.reason_phrase}{detail}"
        )
    try:
        text = response.body.decode("utf-8")
    except UnicodeDecodeError:
        raise ScrapeError(f"{url} sent a body that is not UTF-8 text (binary garbage?)") from None
    return text, response.headers.get("content-type", "")


@dataclass(frozen=True)
class Scrape:
    """One parsed scrape and the monotonic time it was taken."""

    series: Series
    monotonic_seconds: float
    body: str = ""
    content_type: str = ""

    @property
    def is_specobs(self) -> bool:
        return self.series.has(catalog.INFO.name)

    @property
    def info(self) -> dict[str, str]:
        found = self.series.labels(catalog.INFO.name)
        return found[0] if found else {}


def scrape(
    client: Any, url: str, *, openmetrics: bool = False, limits: Limits = _http.DEFAULT_LIMITS
) -> Scrape:
    """Fetch and parse one scrape of a specobs endpoint; raises :class:`ScrapeError`.

    A body that parses but has no ``specobs_info`` is refused: it is some other exporter.
    ``openmetrics`` asks for OpenMetrics (exemplars); the body is kept in :attr:`Scrape.body`.
    """
    t = time.monotonic()
    text, content_type = fetch_text(client, url, openmetrics=openmetrics, limits=limits)
    series = parse_exposition(text)
    result = Scrape(series, t, text, content_type)
    if not result.is_specobs:
        raise ScrapeError(not_specobs_message(url, series))
    return result


def not_specobs_message(url: str, series: Series) -> str:
    if not len(series):
        return f"{url} is not a specobs endpoint: the body has no metrics at all"
    others = sorted(series.names())
    shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
    return (
        f"{url} is not a specobs endpoint: no {catalog.INFO.name} series among "
        f"{len(others)} metrics ({shown})"
    )


# -- two scrapes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Delta:
    """Counter deltas between two polls, the current gauges and the seconds between them."""

    counters: Series
    gauges: Series
    elapsed_seconds: float


@dataclass(frozen=True)
class CounterReset:
    """A counter went down between two polls: the server restarted. No rates this frame."""

    series: str

    def __str__(self) -> str:
        return f"counters reset, rebasing ({self.series} went down: the server restarted?)"


def difference(prev: Scrape, cur: Scrape) -> Delta | CounterReset:
    """``cur - prev`` for every counter-like sample; gauges are ``cur``'s."""
    out = Series()
    for key, value in cur.series.samples.items():
        name = key[0]
        if name not in COUNTER_SERIES:
            continue
        before = prev.series.samples.get(key)
        if before is None:
            # A series that appeared since the last poll (a new drop reason, a new CPU component)
            # started from zero after the previous scrape.
            before = 0.0
        if value < before:
            labels = ",".join(f'{k}="{v}"' for k, v in key[1])
            return CounterReset(f"{name}{{{labels}}}" if labels else name)
        out.samples[key] = value - before
    return Delta(out, cur.series, max(0.0, cur.monotonic_seconds - prev.monotonic_seconds))


# -- the breakdown --------------------------------------------------------------------------------


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``, or ``None`` when either is missing or the denominator is not positive."""
    if num is None or den is None or not den > 0 or math.isnan(num):
        return None
    return num / den


def histogram_quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """Prometheus's ``histogram_quantile`` over cumulative bucket counts keyed by ``le``.

    Linear interpolation inside the bucket holding rank ``q * total``; the lowest bucket
    starts at 0; a rank in the +Inf bucket returns the highest finite bound. ``None`` when there
    are no observations.
    """
    if not cumulative or not 0.0 <= q <= 1.0:
        return None
    bounds = sorted(cumulative)
    if bounds[-1] != math.inf:
        return None
    counts = [cumulative[b] for b in bounds]
    # Deltas of cumulative counts can come out non-monotonic only through float noise.
    for i in range(1, len(counts)):
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if not total > 0:
        return None
    rank = q * total
    i = next(i for i, c in enumerate(counts) if c >= rank)
    if bounds[i] == math.inf:
        return bounds[-2] if len(bounds) > 1 else None
    lower = 0.0 if i == 0 else bounds[i - 1]
    below = 0.0 if i == 0 else counts[i - 1]
    if i == 0 and bounds[0] <= 0:
        return bounds[0]
    in_bucket = counts[i] - below
    if in_bucket <= 0:
        return bounds[i]
    return lower + (bounds[i] - lower) * (rank - below) / in_bucket


@dataclass(frozen=True)
class PhaseStats:
    """One phase on one clock over the interval; times in seconds, ``None`` when unknown."""

    phase: str
    clock: str
    count: float
    mean_seconds: float | None
    share: float | None
    p50_seconds: float | None
    p99_seconds: float | None


@dataclass(frozen=True)
class Breakdown:
    """Everything ``specobs top`` shows for one interval (all from counter deltas)."""

    elapsed_seconds: float
    phases: tuple[str, ...]
    stats: dict[tuple[str, str], PhaseStats]
    cycle_mean_seconds: dict[str, float | None]
    cycle_counts: dict[str, float]
    cycle_quantiles: dict[str, tuple[float | None, float | None]]
    cycles: float
    cycles_per_second: float | None
    sampled_cycles: float | None
    acceptance_rate: float | None
    mean_accept_length: float | None
    position_acceptance: tuple[tuple[str, float | None], ...]
    emitted_tokens_per_second: float | None
    mean_batch_size: float | None
    sequence_tokens_per_second: float | None
    baseline_tokens_per_second: float | None
    drops: dict[str, float]
    dropped_total: float
    sampling_interval: float | None
    overhead_ratio: float | None
    exporter_cpu_seconds_per_cycle: float | None
    info: dict[str, str] = field(default_factory=dict)


def _phases(delta: Series, gauges: Series) -> tuple[str, ...]:
    info = gauges.labels(catalog.INFO.name)
    declared = [p for p in (info[0].get("phases", "") if info else "").split(",") if p]
    seen = list(delta.by(catalog.PHASE_DURATION.name + "_count", "phase"))
    extra = [p for p in seen if p not in declared]
    return (*declared, *extra)


def _buckets(series: Series, name: str, **match: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for le, value in series.by(name + "_bucket", "le", **match).items():
        try:
            out[float(le)] = value
        except ValueError:
            continue
    return out


def breakdown(delta: Delta) -> Breakdown:
    """The cycle breakdown of one interval; see the module docstring."""
    d, g, elapsed = delta.counters, delta.gauges, delta.elapsed_seconds
    phase_m, cycle_m = catalog.PHASE_DURATION.name, catalog.CYCLE_DURATION.name
    phases = _phases(d, g)

    stats: dict[tuple[str, str], PhaseStats] = {}
    cycle_mean: dict[str, float | None] = {}
    cycle_counts: dict[str, float] = {}
    cycle_quantiles: dict[str, tuple[float | None, float | None]] = {}
    for clock in PHASE_CLOCKS:
        means: dict[str, float | None] = {}
        counts: dict[str, float] = {}
        for phase in phases:
            n = d.total(phase_m + "_count", phase=phase, clock=clock) or 0.0
            counts[phase] = n
            means[phase] = ratio(d.total(phase_m + "_sum", phase=phase, clock=clock), n)
        known = [m for m in means.values() if m is not None]
        whole = math.fsum(known) if known else None
        for phase in phases:
            buckets = _buckets(d, phase_m, phase=phase, clock=clock)
            stats[(phase, clock)] = PhaseStats(
                phase, clock, counts[phase], means[phase], ratio(means[phase], whole),
                histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets),
            )
        n = d.total(cycle_m + "_count", clock=clock) or 0.0
        cycle_counts[clock] = n
        cycle_mean[clock] = ratio(d.total(cycle_m + "_sum", clock=clock), n)
        buckets = _buckets(d, cycle_m, clock=clock)
        cycle_quantiles[clock] = (
            histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets)
        )

    cycles = d.total(catalog.CYCLES.name) or 0.0
    drafted = d.total(catalog.DRAFT_TOKENS.name)
    accepted = d.total(catalog.ACCEPTED_TOKENS.name)
    emitted = d.total(catalog.EMITTED_TOKENS.name)
    al = catalog.ACCEPT_LENGTH.name
    bs = catalog.BATCH_SIZE.name

    acc_pos = d.by(catalog.ACCEPTED_BY_POSITION.name, "position")
    draft_pos = d.by(catalog.DRAFTED_BY_POSITION.name, "position")
    positions = sorted(set(acc_pos) | set(draft_pos), key=lambda p: (len(p), p))
    per_position = tuple((p, ratio(acc_pos.get(p), draft_pos.get(p))) for p in positions)

    drops = {k: v for k, v in d.by(catalog.DROPPED_RECORDS.name, "reason").items() if v > 0}
    mean_batch = ratio(d.total(bs + "_sum"), d.total(bs + "_count"))
    host_cycle = cycle_mean.get("host")
    seq_tps = ratio(ratio(emitted, d.total(bs + "_sum")), host_cycle)
    cpu = d.total(catalog.EXPORTER_CPU.name)
    info_labels = g.labels(catalog.INFO.name)

    return Breakdown(
        elapsed_seconds=elapsed,
        phases=phases,
        stats=stats,
        cycle_mean_seconds=cycle_mean,
        cycle_counts=cycle_counts,
        cycle_quantiles=cycle_quantiles,
        cycles=cycles,
        cycles_per_second=ratio(cycles, elapsed),
        sampled_cycles=d.total(catalog.SAMPLED_CYCLES.name),
        acceptance_rate=ratio(accepted, drafted),
        mean_accept_length=ratio(d.total(al + "_sum"), d.total(al + "_count")),
        position_acceptance=per_position,
        emitted_tokens_per_second=ratio(emitted, elapsed),
        mean_batch_size=mean_batch,
        sequence_tokens_per_second=seq_tps,
        baseline_tokens_per_second=g.total(catalog.BASELINE_SEQUENCE_TOKENS.name),
        drops=drops,
        dropped_total=math.fsum(drops.values()),
        sampling_interval=g.total(catalog.SAMPLING_INTERVAL.name),
        overhead_ratio=_max(g, catalog.OVERHEAD_RATIO.name),
        exporter_cpu_seconds_per_cycle=ratio(cpu, cycles),
        info=info_labels[0] if info_labels else {},
    )


def _max(series: Series, name: str) -> float | None:
    values = [v for (n, _), v in series.samples.items() if n == name]
    return max(values) if values else None


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


def _window_text(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _prom_query(
    client: Any, base_url: str, promql: str, at: float | None = None,
    limits: Limits = _http.DEFAULT_LIMITS,
) -> list[dict[str, Any]]:
    url = base_url.rstrip("/") + "/api/v1/query"
    params: dict[str, Any] = {"query": promql}
    if at is not None:
        params["time"] = f"{at:.3f}"
    try:
        response = _http.get(client, url, params=params, limits=limits,
                             headers={"Accept": "application/json"})
    except ScrapeError as exc:
        raise ScrapeError(f"cannot query Prometheus at {base_url}: {exc}") from None
    try:
        payload = json.loads(response.body)
    except ValueError:
        raise ScrapeError(
            f"{base_url} is not a Prometheus server: /api/v1/query answered HTTP "
            f"{response.status_code} with a non-JSON body"
        ) from None
    if not isinstance(payload, dict) or payload.get("status") != "success":
        error = payload.get("error") if isinstance(payload, dict) else None
        raise ScrapeError(
            f"Prometheus at {base_url} rejected {promql!r} (HTTP {response.status_code}): "
            f"{error or 'no error text'}"
        )
    data = payload.get("data") or {}
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("resultType") != "vector" \
            or not isinstance(result, list):
        raise ScrapeError(f"Prometheus at {base_url} answered {promql!r} with no vector")
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
    limits: Limits = _http.DEFAULT_LIMITS, at: float | None = None,
) -> Delta:
    """Counter deltas over the last ``window_seconds`` from a Prometheus server's ``increase()``.

    ``selector`` is the matchers inside the braces (see :func:`normalize_selector`). Raises
    :class:`ScrapeError` when Prometheus fails or has no specobs series for the selector.
    ``at`` is the Unix time the window ends (default: now).
    """
    window = _window_text(window_seconds)
    # Every query is evaluated at the same instant: increase() extrapolates to the window's
    # edges, so series read at different moments would not divide into exact ratios.
    at = time.time() if at is None else at
    counters = Series()
    for name in sorted(COUNTER_SERIES):
        promql = f"increase({name}{{{selector}}}[{window}])"
        _add_result(counters, name, _prom_query(client, base_url, promql, at, limits))
    gauges = Series()
    for m in (catalog.INFO, catalog.BASELINE_SEQUENCE_TOKENS, catalog.SAMPLING_INTERVAL,
              catalog.OVERHEAD_RATIO):
        promql = f"{m.name}{{{selector}}}"
        _add_result(gauges, m.name, _prom_query(client, base_url, promql, at, limits))
    if not gauges.has(catalog.INFO.name):
        raise ScrapeError(
            f"Prometheus at {base_url} has no {catalog.INFO.name}{{{selector}}}: check the "
            "selector and that Prometheus scrapes the specobs endpoint"
        )
    return Delta(counters, gauges, window_seconds)


def speedups(
    b: Breakdown, draft_phase: str = "draft", verify_phase: str = "verify"
) -> tuple[float | None, dict[str, float | None]]:
    """Realized and predicted (per clock) speedup of one interval, as the recording rules define
    them (``instance:specobs_speedup:realized_rate*`` and ``...:predicted_rate*``).

    Realized: tokens/s per sequence over the non-speculative baseline gauge, whatever its
    ``source`` (configured, or measured by the engine at the batch size it serves, as
    ``specobs demo`` does). Predicted: tokens per sequence-cycle times verify / (draft + verify)
    on each clock. ``specobs top``, ``report`` and ``doctor`` all use this one definition.
    """
    realized = ratio(b.sequence_tokens_per_second, b.baseline_tokens_per_second)
    host_cycle = b.cycle_mean_seconds.get("host")
    per_sequence_cycle = (
        b.sequence_tokens_per_second * host_cycle
        if b.sequence_tokens_per_second is not None and host_cycle is not None else None
    )
    predicted: dict[str, float | None] = {}
    for clock in PHASE_CLOCKS:
        draft, verify = b.stats.get((draft_phase, clock)), b.stats.get((verify_phase, clock))
        if draft is None or verify is None or per_sequence_cycle is None \
                or draft.mean_seconds is None or verify.mean_seconds is None:
            predicted[clock] = None
            continue
        cost = ratio(verify.mean_seconds, draft.mean_seconds + verify.mean_seconds)
        predicted[clock] = None if cost is None else per_sequence_cycle * cost
    return realized, predicted


# -- formatting -----------------------------------------------------------------------------------

DASH = "—"


def format_seconds(value: float | None, plain: bool = False) -> str:
    """``0.0002`` → ``"200.0 µs"`` (``plain``: ``"200.0us"``); ``None`` → ``"—"``."""
    if value is None or math.isnan(value):
        return DASH
    sep, micro = ("", "us") if plain else (" ", "µs")
    if value < 1e-3:
        return f"{value * 1e6:.1f}{sep}{micro}"
    if value < 1.0:
        return f"{value * 1e3:.2f}{sep}ms"
    return f"{value:.2f}{sep}s"


def format_rate(value: float | None, digits: int = 1, suffix: str = "") -> str:
    if value is None or math.isnan(value):
        return DASH
    return f"{value:.{digits}f}{suffix}"


def format_percent(value: float | None, digits: int = 1) -> str:
    if value is None or math.isnan(value):
        return DASH
    return f"{value * 100:.{digits}f}%"


__all__ += [
    "COUNTER_SERIES",
    "DASH",
    "OPENMETRICS_ACCEPT",
    "format_percent",
    "normalize_selector",
    "not_specobs_message",
    "parse_window",
    "speedups",
]
