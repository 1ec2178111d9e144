"""Where ``specobs top``'s frames come from: a /metrics endpoint (two scrapes differenced) or a
Prometheus server (``increase()`` over the interval); a :class:`Frame` is the breakdown of one
interval and its diagnosis."""


from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from specobs import catalog
from specobs.tools import _breakdown as bd
from specobs.tools import _client
from specobs.tools import _diagnosis as dg
from specobs.tools import _engine_series as es
from specobs.tools import _promapi as pa
from specobs.tools import _scrape as scr
from specobs.tools._top._requests import RequestAcceptance, request_acceptance

__all__ = ["EndpointSource", "Frame", "PrometheusSource", "status_text"]


@dataclass(frozen=True)
class Frame:
    """What one poll produced: ``kind`` is data, waiting, reset or error."""

    kind: str
    message: str = ""
    breakdown: bd.Breakdown | None = None
    #: The diagnosis of this poll's interval (docs/diagnosis.md): the status line.
    findings: tuple[dg.Finding, ...] = ()
    #: The interval's finished requests' acceptance; ``None`` when the source has none.
    requests: RequestAcceptance | None = None
    #: The engine whose own series the frame was read from (a server without specobs's
    #: plugin: what needs the plugin is absent, not zero); ``None`` for the plugin's series.
    engine: str | None = None
    #: The server of an engine frame.
    instance: str | None = None


class EndpointSource:
    """Polls a specobs /metrics endpoint and differences consecutive scrapes."""

    def __init__(self, client: Any, url: str, limits: _client.Limits = _client.DEFAULT_LIMITS
                 ) -> None:
        self.client = client
        self.url = url
        self.limits = limits
        self.description = _client.display_url(url)
        self._prev: scr.Scrape | None = None

    def poll(self) -> Frame:
        try:
            # OpenMetrics: the worst requests' trace ids come as exemplars.
            cur = scr.scrape(self.client, self.url, openmetrics=True, limits=self.limits)
        except scr.ScrapeError as exc:
            return Frame("error", str(exc))
        prev, self._prev = self._prev, cur
        if prev is None:
            return Frame("waiting", "waiting for a second sample")
        delta = scr.difference(prev, cur)
        if isinstance(delta, scr.CounterReset):
            return Frame("reset", str(delta))
        window = dg.window(delta, time.time())
        return _data_frame(window.breakdown, tuple(dg.diagnose(window)),
                           request_acceptance(delta.counters, cur.series.exemplars))


class PrometheusSource:
    """Queries ``increase(...[window])`` from a Prometheus server on every poll; where the
    selector matches no plugin's series, one server's engine series
    (:mod:`specobs.tools._engine_series`)."""

    def __init__(self, client: Any, base_url: str, selector: str, window_seconds: float,
                 limits: _client.Limits = _client.DEFAULT_LIMITS) -> None:
        self.client = client
        self.limits = limits
        self.base_url = base_url
        self.selector = selector
        self.window_seconds = window_seconds
        self.description = (
            f"{_client.display_url(base_url)} {{{selector}}} over "
            f"{scr.format_rate(window_seconds, 0)}s"
        )

    def poll(self) -> Frame:
        try:
            delta = pa.prometheus_delta(
                self.client, self.base_url, self.selector, self.window_seconds,
                limits=self.limits,
            )
        except pa.NoPluginSeries as exc:
            return self._engine_frame(str(exc))
        except scr.ScrapeError as exc:
            return Frame("error", str(exc))
        if not delta.counters.has(catalog.CYCLES.name):
            return Frame(
                "waiting",
                f"waiting for Prometheus to hold two samples of {catalog.CYCLES.name} in "
                f"the last {scr.format_rate(self.window_seconds, 0)} s",
            )
        window = dg.window(delta, time.time())
        return _data_frame(window.breakdown, tuple(dg.diagnose(window)),
                           request_acceptance(delta.counters, {}))


    def _engine_frame(self, plugin_error: str) -> Frame:
        """One server read through its engine's own series, or the plugin's error when the
        selector matches no engine series either."""
        try:
            servers = es.engine_servers(self.client, self.base_url, self.selector,
                                        self.window_seconds, limits=self.limits, at=time.time())
        except scr.ScrapeError:
            return Frame("error", plugin_error)
        if not servers:
            return Frame("error", f"{plugin_error}; nor does it hold an engine's own "
                                  "speculative decoding series for the selector")
        if len(servers) > 1:
            return Frame("error", f"{len(servers)} servers without the plugin match "
                                  f"({', '.join(servers)}): their engines' figures do not add "
                                  "up; narrow --selector to one instance")
        (server,) = servers.values()
        b = server.window().breakdown
        if b.acceptance_rate is None and b.emitted_tokens_per_second is None:
            return Frame("waiting", f"waiting for Prometheus to hold two samples of "
                                    f"{server.title}'s series in the last "
                                    f"{scr.format_rate(self.window_seconds, 0)} s")
        return Frame("data", "", b, tuple(server.findings(None)), None,
                     engine=server.title, instance=server.instance)


def _data_frame(b: bd.Breakdown, findings: tuple[dg.Finding, ...] = (),
                requests: RequestAcceptance | None = None) -> Frame:
    if not b.cycles > 0:
        stalled = next((f for f in findings if f.code == "SPEC-STALL"), None)
        if stalled is not None:
            return Frame("data", stalled.sentence, b, findings, requests)
        return Frame("data", f"no cycles in the last {b.elapsed_seconds:.1f} s (idle?)", b,
                     findings, requests)
    return Frame("data", "", b, findings, requests)


def status_text(findings: tuple[dg.Finding, ...]) -> str:
    """The status line: the worst severity, the codes that carry it and the worst finding's
    sentence (``OK: no problem found`` when nothing warns or fails)."""
    line = dg.status_line(findings)
    worst = dg.worst(findings)
    first = next((f for f in findings if f.severity == worst), None)
    if first is None or worst not in ("warn", "fail"):
        return line
    return f"{line}: {first.sentence}"
