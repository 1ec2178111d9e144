"""``specobs doctor --prometheus``: the same findings from a Prometheus server's ``increase()``
windows instead of two scrapes, one server against its cohort, and the batch threshold fitted
over the batch sizes the history served (:func:`history_windows`)."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from specobs import catalog
from specobs.tools import _client
from specobs.tools import _diagnosis as dg
from specobs.tools import _promapi as pa
from specobs.tools import _scrape as scr
from specobs.tools._doctor._checks import Check, Report

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
    and findings as two scrapes give; the endpoint checks do not apply)."""
    at = time.time() if now is None else now
    shown = f"{_client.display_url(base_url)} {{{selector}}}"
    try:
        recent = pa.prometheus_delta(client, base_url, selector, window_seconds, limits=limits,
                                     at=at, extra_gauges=_DIAGNOSIS_GAUGES)
    except scr.ScrapeError as exc:
        return Report([Check("prometheus", "FAIL", str(exc))])
    instances = sorted({d.get("instance", "") for d in recent.gauges.labels(catalog.INFO.name)})
    checks = [Check(
        "prometheus", "OK",
        f"{shown}: {len(instances)} server{'s' if len(instances) != 1 else ''} "
        f"({', '.join(i for i in instances if i) or 'no instance label'}), window "
        f"{pa.window_text(window_seconds)}",
        {"instances": instances},
    )]
    if len(instances) > 1:
        checks.append(Check(
            "one server", "INFO",
            f"{len(instances)} servers match: the findings are of their sum; narrow it with "
            "--instance", {"instances": instances},
        ))
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
