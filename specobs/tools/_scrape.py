"""Read a live specobs endpoint for the terminal tools (``specobs top``, ``specobs doctor``).

Two steps, each a plain function of its input so tests can check the arithmetic exactly:

* :func:`fetch_text` / :func:`parse_exposition`: one scrape into a :class:`Series` (samples keyed
  by name and labels). Every failure — refused connection, HTTP error, an HTML page, garbage — is
  a :class:`ScrapeError` with a one-line message; nothing else escapes.
* :func:`difference`: two scrapes into counter deltas over the elapsed seconds, or
  :class:`CounterReset` when any counter went down (the server restarted between polls).

The deltas become the cycle breakdown in :mod:`specobs.tools._breakdown`;
:mod:`specobs.tools._promapi` builds the same deltas from a Prometheus server's ``increase()``,
so both sources share one breakdown. The terminal formatting helpers (:func:`format_seconds`,
:func:`format_rate`, :func:`format_percent`) are here too.

Metric names come from :mod:`specobs.catalog` only. httpx and prometheus_client are imported
inside the functions that use them: importing this module costs nothing.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from specobs import catalog
from specobs.tools import _client
from specobs.tools._client import Limits, ScrapeError

__all__ = [
    "COUNTER_SERIES",
    "DASH",
    "OPENMETRICS_ACCEPT",
    "CounterReset",
    "Delta",
    "Exemplar",
    "Limits",
    "Scrape",
    "ScrapeError",
    "Series",
    "difference",
    "fetch_text",
    "format_percent",
    "format_rate",
    "format_seconds",
    "normalize_url",
    "not_specobs_message",
    "parse_exposition",
    "scrape",
]

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
    ``default_path``. Credentials (``http://user:password@host/``) are kept for the request and
    left out of the messages (see :func:`specobs.tools._client.display_url`).
    """
    text = raw.strip()
    if not text:
        raise ValueError("empty URL; expected e.g. http://127.0.0.1:9477/metrics")
    if "://" not in text:
        text = f"http://{text}"
    # What the messages quote: the URL as given, less any credentials.
    shown = repr(raw if _client.display_url(text) == text else _client.display_url(text))
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(
            f"unsupported URL scheme {parts.scheme!r} in {shown}; expected http:// or https://, "
            f"e.g. http://127.0.0.1:9477/metrics"
        )
    if not parts.hostname:
        raise ValueError(f"no host in {shown}; expected e.g. http://127.0.0.1:9477/metrics")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(
            f"bad port in {shown}; expected e.g. http://127.0.0.1:9477/metrics"
        ) from None
    if parts.path == "" and default_path:
        text = parts._replace(path=default_path).geturl()
    return text


# -- one scrape -----------------------------------------------------------------------------------


class Series:
    """Samples keyed by ``(name, sorted label pairs)`` with small summing helpers.

    Labels not asked about (job, instance, constant labels such as ``model``) are summed over, so
    an endpoint serving several observers (each with its own constant labels) reads as their
    total. One key twice in a scrape is refused by :func:`parse_exposition`, never summed.
    ``exemplars``: the OpenMetrics exemplars a scrape carried, by sample key.
    """

    __slots__ = ("exemplars", "samples")

    def __init__(self, samples: Mapping[tuple[str, LabelKey], float] | None = None) -> None:
        self.samples: dict[tuple[str, LabelKey], float] = dict(samples or {})
        self.exemplars: dict[tuple[str, LabelKey], Exemplar] = {}

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

    def max(self, name: str, **match: str) -> float | None:
        """The largest of the matching series, or ``None`` when there is none: a gauge that
        summed over observers would mean nothing (a ratio, a sampling interval)."""
        values = [v for _, v in self._matching(name, match)]
        return max(values) if values else None

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
    """Parse Prometheus text (or OpenMetrics) exposition; raises :class:`ScrapeError`.

    A sample whose name and labels came earlier in the same body is refused with the rest of
    the scrape, as Prometheus refuses it ("duplicate sample for timestamp"): summed, the numbers
    would be wrong (doubled for an endpoint serving everything twice), and which copy is right
    cannot be told.
    """
    from prometheus_client.parser import text_string_to_metric_families

    stripped = text.lstrip()
    if stripped[:1] == "<":
        raise ScrapeError(
            "the body is HTML, not Prometheus metrics (is the URL the /metrics path?)"
        )
    if "# EOF" in text[-64:]:
        # OpenMetrics: its own parser understands exemplars, units and the EOF marker. A body
        # of several complete expositions (a proxy serving it twice) is read part by part, so
        # its repeated samples are reported as duplicates below, as in the text format.
        from prometheus_client.openmetrics.parser import (
            text_string_to_metric_families as openmetrics_families,
        )

        parts = [p + "# EOF\n" for p in re.split(r"(?m)^# EOF[ \t]*$\n?", text) if p.strip()]
        families: Any = itertools.chain.from_iterable(
            openmetrics_families(part) for part in parts)  # type: ignore[no-untyped-call]
    else:
        families = text_string_to_metric_families(text)
    series = Series()
    samples = series.samples
    nan_keys: set[tuple[str, LabelKey]] = set()
    duplicates = 0
    first_duplicate = ""
    try:
        for family in families:
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                value = float(sample.value)
                if key in samples or key in nan_keys:
                    duplicates += 1
                    first_duplicate = first_duplicate or sample.name
                elif math.isnan(value):
                    nan_keys.add(key)
                else:
                    samples[key] = value
                    ex = getattr(sample, "exemplar", None)
                    if ex is not None:
                        series.exemplars[key] = Exemplar(
                            dict(ex.labels), float(ex.value),
                            None if ex.timestamp is None else float(ex.timestamp))
    except Exception as exc:  # the parsers raise ValueError, IndexError, KeyError, ...
        # Both parts are cut short: the parser quotes the offending text, which may be huge.
        first = next((line for line in text[:4096].splitlines() if line.strip()), "")
        reason = " ".join(str(exc).split())
        reason = reason if len(reason) <= 100 else reason[:97] + "..."
        raise ScrapeError(
            f"the body is not Prometheus text exposition ({reason}); it starts with "
            f"{first[:60]!r}"
        ) from None
    if duplicates:
        # Only the sample name is quoted: label values are the server's text (terminal escapes).
        name = _NOT_NAME.sub("?", first_duplicate)[:80]
        plural = "s" if duplicates != 1 else ""
        raise ScrapeError(
            f"the body has {duplicates} duplicate sample{plural} (the name and labels of an "
            f"earlier one; first: {name}): Prometheus rejects such a scrape (\"duplicate sample "
            "for timestamp\") and summing them would count twice; are two observers served "
            "with the same labels? Give each its own constant labels"
        )
    return series


_NOT_NAME = re.compile(r"[^A-Za-z0-9_:]")


def fetch_text(
    client: Any, url: str, *, openmetrics: bool = False, limits: Limits = _client.DEFAULT_LIMITS
) -> tuple[str, str]:
    """GET ``url`` within ``limits``; returns ``(body, content type)``. Raises
    :class:`ScrapeError` (see :func:`specobs.tools._client.get`)."""
    headers = {"Accept": OPENMETRICS_ACCEPT} if openmetrics else {"Accept": "text/plain"}
    response = _client.get(client, url, headers=headers, limits=limits)
    shown = _client.display_url(url)
    if response.status_code != 200:
        body = response.body.decode("utf-8", "replace").strip().splitlines()
        # The first line of the answer, less any credential of the URL a server echoes back.
        detail = f": {_client.scrub(body[0], url)[:80]}" if body else ""
        raise ScrapeError(
            f"{shown} answered HTTP {response.status_code} {response.reason_phrase}{detail}"
        )
    try:
        text = response.body.decode("utf-8")
    except UnicodeDecodeError:
        raise ScrapeError(
            f"{shown} sent a body that is not UTF-8 text (binary garbage?)"
        ) from None
    return text, response.headers.get("content-type", "")


@dataclass(frozen=True)
class Exemplar:
    """An OpenMetrics exemplar of one sample: its labels (``trace_id``, ...) and value."""

    labels: dict[str, str]
    value: float
    timestamp: float | None


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
    client: Any, url: str, *, openmetrics: bool = False, limits: Limits = _client.DEFAULT_LIMITS
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
    url = _client.display_url(url)
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

