"""``specobs doctor --prometheus``: the same findings from a Prometheus server's ``increase()``
windows instead of two scrapes, one server against its cohort, and the batch threshold fitted
over the batch sizes the history served (:func:`history_windows`).

A server without specobs's plugin is read through its engine's own series
(:mod:`specobs.tools._engine_series`): its acceptance, profile and tokens/s are judged, and
what needs the plugin is a ``SKIP`` line saying so. When the selector matches several servers
(plugin or engine alike) each is diagnosed on its own (:func:`_survey`): a line per server
with its worst finding, and the findings that warn or fail named with their server."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from specobs import catalog
from specobs.mixin import _engines
from specobs.tools import _client
from specobs.tools import _diagnosis as dg
from specobs.tools import _engine_series as es
from specobs.tools import _promapi as pa
from specobs.tools import _scrape as scr
from specobs.tools._doctor._checks import _VERDICT, Check, Report

__all__ = ["BATCH_WINDOWS_MAX", "COHORT_LABELS", "examine_prometheus", "history_split",
           "history_windows"]

_DIAGNOSIS_GAUGES = (catalog.REQUESTS_RUNNING, catalog.REQUESTS_WAITING,
                     catalog.LAST_CYCLE_TIMESTAMP)


def examine_prometheus(
    client: Any, base_url: str, selector: str, window_seconds: float, history_seconds: float,
    limits: _client.Limits = _client.DEFAULT_LIMITS, now: float | None = None,
) -> Report:
    """Diagnose the servers ``selector`` matches from a Prometheus server: ``increase()`` over
    the last ``window_seconds`` against the ``history_seconds`` before it (the same breakdown
    and findings as two scrapes give; the endpoint checks do not apply). Servers without the
    plugin are read through their engine's own series; several servers are each diagnosed on
    their own."""
    at = time.time() if now is None else now
    shown = f"{_client.display_url(base_url)} {{{selector}}}"
    recent: scr.Delta | None
    try:
        recent = pa.prometheus_delta(client, base_url, selector, window_seconds, limits=limits,
                                     at=at, extra_gauges=_DIAGNOSIS_GAUGES)
        plugin_error = ""
    except pa.NoPluginSeries as exc:
        recent, plugin_error = None, str(exc)
    except scr.ScrapeError as exc:
        # Prometheus itself failed: asking it again for the engines' series would not help.
        return Report([Check("prometheus", "FAIL", str(exc))])
    plugin = _instances(recent)
    try:
        engines = es.engine_servers(client, base_url, selector, window_seconds, limits=limits,
                                    at=at, plugin_hosts=frozenset(map(es.host_of, plugin)))
    except scr.ScrapeError as exc:
        if recent is None:
            return Report([Check("prometheus", "FAIL", plugin_error)])
        plugin_error, engines = str(exc), {}
    if recent is None and not engines:
        return Report([Check(
            "prometheus", "FAIL",
            f"{plugin_error}; nor does it hold an engine's own speculative decoding series "
            f"for the selector ({', '.join(e.title for e in _engines.ENGINES)})",
        )])
    window_text = pa.window_text(window_seconds)
    if len(plugin) + len(engines) > 1:
        return _survey(client, base_url, selector, recent, engines, window_seconds,
                       history_seconds, limits, at, shown)
    if engines:
        (server,) = engines.values()
        return _engine_report(client, base_url, selector, server, window_seconds,
                              history_seconds, limits, at, shown)
    assert recent is not None
    instances = plugin
    checks = [Check(
        "prometheus", "OK",
        f"{shown}: {len(instances)} server{'s' if len(instances) != 1 else ''} "
        f"({', '.join(i for i in instances if i) or 'no instance label'}), window "
        f"{window_text}",
        {"instances": instances},
    )]
    past: dg.Window | None = None
    try:
        before = pa.prometheus_delta(client, base_url, selector, history_seconds, limits=limits,
                                     at=at - window_seconds)
    except scr.ScrapeError as exc:
        checks.append(Check("history", "INFO", f"no past to compare with: {exc}"))
    else:
        if (before.counters.total(catalog.CYCLES.name) or 0.0) > 0:
            past = dg.window(before)
            checks.append(Check(
                "history", "OK",
                f"compared with the {pa.window_text(history_seconds)} before the window",
            ))
        else:
            checks.append(Check("history", "INFO",
                                f"no cycles in the {pa.window_text(history_seconds)} before "
                                "the window: nothing to compare with"))
    window = dg.window(recent, at)
    batches = history_windows(client, base_url, selector, window_seconds, history_seconds,
                              limits, at, checks) if past is not None else []
    findings = dg.diagnose(window, past, batches)
    if len(instances) == 1 and instances[0] and not any(f.code == "SPEC-STALL"
                                                         for f in findings):
        findings += _against_cohort(client, base_url, recent, window, instances[0],
                                    window_seconds, limits, at, checks)
    return Report(checks, findings, window)


def _instances(delta: scr.Delta | None) -> list[str]:
    """The servers of a plugin's window: the instances of its info series."""
    if delta is None:
        return []
    return sorted({d.get("instance", "") for d in delta.gauges.labels(catalog.INFO.name)})


def _only(delta: scr.Delta, instance: str) -> scr.Delta:
    """The part of a window of several servers that is ``instance``'s."""

    def keep(series: scr.Series) -> scr.Series:
        return scr.Series({key: value for key, value in series.samples.items()
                           if dict(key[1]).get("instance") == instance})

    return scr.Delta(keep(delta.counters), keep(delta.gauges), delta.elapsed_seconds)


def _needs_plugin(checks: list[Check], which: str) -> None:
    """One ``SKIP`` line per figure only the plugin measures."""
    for name, what in es.NEEDS_PLUGIN:
        checks.append(Check(name, "SKIP", f"{es.NEEDS_PLUGIN_TEXT}: {what} ({which})",
                            {"needs_plugin": True}))


def _engine_figures(server: es.EngineServer) -> str:
    b = server.window().breakdown
    return (f"acceptance {_pct(b.acceptance_rate)}, accept length "
            f"{_num(b.mean_acceptance_length, 2)}, {_num(b.emitted_tokens_per_second, 1)} "
            "tokens/s")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _engine_report(client: Any, base_url: str, selector: str, server: es.EngineServer,
                   window_seconds: float, history_seconds: float, limits: _client.Limits,
                   at: float, shown: str) -> Report:
    """One server without the plugin: its engine's own series over the window, against the
    history before it."""
    checks = [Check(
        "prometheus", "OK",
        f"{shown}: 1 server ({server.instance}, {server.title}'s own series, job {server.job}; "
        f"no specobs plugin), window {pa.window_text(window_seconds)}",
        {"instances": [server.instance], es.ENGINE_LABEL: server.engine,
         "source": es.SOURCE},
    )]
    past = _engine_past(client, base_url, selector, server, window_seconds, history_seconds,
                        limits, at, checks)
    checks.append(Check("engine series", "OK", f"{server.title}: {_engine_figures(server)}",
                        {"engine": server.engine}))
    _needs_plugin(checks, f"{server.title} exports none of it")
    return Report(checks, server.findings(past), server.window())


def _engine_past(client: Any, base_url: str, selector: str, server: es.EngineServer,
                 window_seconds: float, history_seconds: float, limits: _client.Limits,
                 at: float, checks: list[Check]) -> es.EngineServer | None:
    """The same server over the history before the window, with a ``history`` line."""
    history = pa.window_text(history_seconds)
    try:
        before = es.engine_servers(client, base_url, f"instance={json.dumps(server.instance)}",
                                   history_seconds, limits=limits, at=at - window_seconds)
    except scr.ScrapeError as exc:
        checks.append(Check("history", "INFO", f"no past to compare with: {exc}"))
        return None
    past = before.get(server.instance)
    if past is None or not past.drafts:
        checks.append(Check("history", "INFO", f"no drafts in the {history} before the window: "
                                               "nothing to compare with"))
        return None
    checks.append(Check("history", "OK", f"compared with the {history} before the window"))
    return past


def _survey(client: Any, base_url: str, selector: str, recent: scr.Delta | None,
            engines: dict[str, es.EngineServer], window_seconds: float, history_seconds: float,
            limits: _client.Limits, at: float, shown: str) -> Report:
    """Several servers, each diagnosed on its own against its own past: a line per server with
    its worst findings, and every finding that warns or fails named with its server. A sum of
    servers would mean nothing across engines, and one bad server would vanish in it."""
    plugin = _instances(recent)
    servers = [*plugin, *engines]
    checks = [Check(
        "prometheus", "OK",
        f"{shown}: {len(servers)} servers ({len(plugin)} with the plugin, {len(engines)} read "
        f"through their engine's own series), window {pa.window_text(window_seconds)}: each "
        "diagnosed on its own",
        {"instances": servers},
    )]
    before: scr.Delta | None = None
    if plugin:
        try:
            before = pa.prometheus_delta(client, base_url, selector, history_seconds,
                                         limits=limits, at=at - window_seconds)
        except scr.ScrapeError:
            before = None
    try:
        engines_before = es.engine_servers(
            client, base_url, selector, history_seconds, limits=limits, at=at - window_seconds,
            plugin_hosts=frozenset(map(es.host_of, plugin))) if engines else {}
    except scr.ScrapeError:
        engines_before = {}
    findings: list[dg.Finding] = []
    for instance in plugin:
        assert recent is not None
        mine = _only(recent, instance)
        past = None
        if before is not None:
            theirs = _only(before, instance)
            if (theirs.counters.total(catalog.CYCLES.name) or 0.0) > 0:
                past = dg.window(theirs)
        window = dg.window(mine, at)
        info = mine.gauges.labels(catalog.INFO.name)
        engine = (info[0].get(es.ENGINE_LABEL) if info else None) or "?"
        b = window.breakdown
        found = dg.diagnose(window, past)
        figures = (f"acceptance {_pct(b.acceptance_rate)}, "
                   f"{_num(b.emitted_tokens_per_second, 1)} tokens/s")
        checks.append(_server_line(instance, f"{engine}, plugin", figures, found))
        findings += _named(instance, f"{engine}, plugin", found)
    for instance, server in engines.items():
        found = server.findings(engines_before.get(instance))
        where = f"{server.title}, engine series"
        checks.append(_server_line(instance, where, _engine_figures(server), found))
        findings += _named(instance, where, found)
    if engines:
        checks.append(Check(
            "needs the plugin", "SKIP",
            f"{', '.join(name for name, _ in es.NEEDS_PLUGIN)} of the {len(engines)} "
            f"server{'s' if len(engines) != 1 else ''} read through their engine's own series "
            f"({', '.join(engines)}): {es.NEEDS_PLUGIN_TEXT}",
            {"needs_plugin": [name for name, _ in es.NEEDS_PLUGIN], "instances": list(engines)}))
    return Report(checks, findings)


def _server_line(instance: str, where: str, figures: str, found: list[dg.Finding]) -> Check:
    level = dg.worst(found)
    worst = [f.code for f in found if f.severity == level and level in ("warn", "fail")]
    return Check(instance, _VERDICT[level],
                 f"{where}: {figures}" + (f"; {', '.join(worst)}" if worst else ""),
                 {"instance": instance, "codes": [f.code for f in found]})


def _named(instance: str, where: str, found: list[dg.Finding]) -> list[dg.Finding]:
    """The findings that warn or fail, their sentence naming the server."""
    return [dg.Finding(f.code, f.severity, f"{instance} ({where}): {f.sentence}",
                       {**f.evidence, "instance": instance}, f.advice)
            for f in found if f.severity in ("warn", "fail")]


#: The history is split into windows as long as ``--window``, or into this many longer ones.
BATCH_WINDOWS_MAX = 60


def history_split(window_seconds: float, history_seconds: float, at: float
                  ) -> tuple[float, float, float]:
    """``(start, end, step)`` of the windows :func:`history_windows` reads: as long as the
    recent window, or ``history / BATCH_WINDOWS_MAX`` when longer (the history itself when
    shorter), as many as fit in the history, the last ending where the recent window begins
    (times to the millisecond, as Prometheus is asked)."""
    step = round(min(max(window_seconds, history_seconds / BATCH_WINDOWS_MAX),
                     history_seconds), 3)
    n = max(1, math.floor(history_seconds / step + 1e-9))
    end = round(at - window_seconds, 3)
    return end - n * step, end, step


def history_windows(client: Any, base_url: str, selector: str, window_seconds: float,
                    history_seconds: float, limits: _client.Limits, at: float,
                    checks: list[Check]) -> list[dg.Window]:
    """The history before the recent window split into windows for the batch threshold
    (``diagnose(..., batch_windows=...)``): consecutive ``increase()`` windows as long as the
    recent one (longer when that would make more than :data:`BATCH_WINDOWS_MAX`), ending
    where the recent window begins, each with the baseline read at its end; a window with
    fewer than 50 cycles joined with the next of the same batch size
    (:func:`specobs.tools.report._data.batch_windows`). Adds a ``batch sizes`` check saying
    which batch sizes they served."""
    from specobs.tools.report import _data as rd  # the report's windows, read the same way

    start, end, step = history_split(window_seconds, history_seconds, at)
    try:
        split = rd.prometheus_windows(
            rd.PrometheusRange(client, base_url, selector, start, end, step, limits))
    except rd.RunError as exc:
        checks.append(Check("batch sizes", "INFO", f"the history could not be split: {exc}"))
        return []
    windows = rd.batch_windows(split)
    points = [p for w in windows if (p := dg.batch_point(w)) is not None]
    length = pa.window_text(step)
    if not points:
        checks.append(Check(
            "batch sizes", "INFO",
            f"no {length} window of the history holds {dg.MIN_SPEEDUP_CYCLES:.0f} cycles with "
            "a baseline the engine measured on the served batch: the batch threshold is read "
            "from the recent window alone", {"windows": len(split), "points": 0}))
        return []
    batches = sorted({round(p.batch, 1) for p in points})
    checks.append(Check(
        "batch sizes", "OK",
        f"{len(points)} window{'s' if len(points) != 1 else ''} of the history ({length} "
        f"each, or joined to {dg.MIN_SPEEDUP_CYCLES:.0f} cycles) served mean batch "
        f"{', '.join(f'{b:g}' for b in batches)}: the batch threshold is fitted over them and "
        "the recent window", {"windows": len(split), "points": len(points), "batches": batches}))
    return windows


#: The labels that make a cohort, as the generated rules group servers (MixinConfig's
#: cohort_by): the same model on the same engine, in one cluster and namespace where present.
COHORT_LABELS = ("cluster", "namespace", "model_name", "serving_engine")


def _against_cohort(client: Any, base_url: str, recent: scr.Delta, window: dg.Window,
                    instance: str, window_seconds: float, limits: _client.Limits, at: float,
                    checks: list[Check]) -> list[dg.Finding]:
    """The server's window against the same window of the other servers of its cohort."""
    info = recent.gauges.labels(catalog.INFO.name)
    labels = info[0] if info else {}
    keys = [k for k in COHORT_LABELS if labels.get(k)]
    if not {"model_name", "serving_engine"} <= set(keys):
        checks.append(Check("cohort", "SKIP", "no model_name and serving_engine labels on the "
                            "server's series: no cohort to compare with"))
        return []
    matchers = [f'{k}="{json.dumps(labels[k])[1:-1]}"' for k in keys]
    matchers.append(f'instance!="{json.dumps(instance)[1:-1]}"')
    selector = ",".join(matchers)
    name = f"{labels['model_name']} on {labels['serving_engine']}"
    try:
        cohort = pa.prometheus_delta(client, base_url, selector, window_seconds, limits=limits,
                                     at=at)
    except scr.ScrapeError:
        checks.append(Check("cohort", "INFO", f"no other server of {name} to compare with"))
        return []
    peers = sorted({d.get("instance", "") for d in cohort.gauges.labels(catalog.INFO.name)})
    checks.append(Check("cohort", "OK", f"compared with the other {len(peers)} server"
                        f"{'s' if len(peers) != 1 else ''} of {name} ({', '.join(peers)})",
                        {"peers": peers, "selector": selector}))
    theirs = dg.window(cohort, at)
    drafted = None
    if window.drafted_first is not None and theirs.drafted_first is not None:
        drafted = (theirs.drafted_first, window.drafted_first)
    return dg.against_cohort(window.breakdown, theirs.breakdown, len(peers), name, drafted)
