"""Scoring alerts against the faults ``specobs fleet-sim`` injected.

Each fault kind *expects* some alerts (they must fire for the faulted servers, their host or their
cohort) and *allows* a few more that are true symptoms of the same fault (an acceptance collapse
also makes the server slower than its cohort). A firing alert is a true positive when it names a
faulted server, host or cohort whose fault expects or allows it and it fired after the fault
began; every other firing alert is a false positive. Recall counts, for every fault, the expected
(alert, server/host/cohort) pairs that fired; time to fire is from the fault to the first
evaluation at which the alert was firing.

A server without specobs's plugin (``--engines``) is seen only through its engine's own series,
which show acceptance but not phase timing, the time of the last cycle, or a specobs endpoint.
Its faults are judged only where those series can show them (:data:`ENGINE_VISIBLE`): an
acceptance collapse and a bad rollout; a verify slowdown, a stall or a broken endpoint of such a
server expects no alert (not counted as a miss), and the alerts they allow stay allowed.

``specobs fleet-sim --score PROMETHEUS_URL`` asks the Prometheus that scrapes the fleet and
evaluates the rules when each alert first fired (:func:`first_firing_query`), scores the alerts
against the faults the run injected and prints the table (:func:`score_table`). Alert names come
from the rules' one table (:class:`specobs.mixin._rules.AlertNames`).

Also here: :data:`SHORT_WINDOWS`, the rule windows scaled down ~15x so a test or a benchmark sees
every alert fire within minutes instead of an hour.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specobs.mixin import _engines
from specobs.mixin._rules import ALERT_PREFIX
from specobs.mixin._rules import AlertNames as A
from specobs.tools.fleet._engine_series import engine_job

__all__ = ["ALERT_MAP", "ENGINE_VISIBLE", "SHORT_WINDOWS", "AlertScore", "FaultEvent",
           "fault_events", "firing_from_matrix", "firing_from_vector", "first_firing_query",
           "judged", "load_events", "score", "score_table"]

#: fault kind -> (alerts that must fire, alerts that may fire as true symptoms)
ALERT_MAP: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "acceptance_collapse": (
        frozenset({A.ACCEPTANCE_BELOW_COHORT}),
        frozenset({A.DECODE_THROUGHPUT_BELOW_COHORT, A.DECODE_THROUGHPUT_DROP,
                   A.SPECULATION_SLOWER_THAN_BASELINE, A.ACCEPTANCE_RATE_DROP}),
    ),
    "verify_slowdown": (
        frozenset({A.PHASE_LATENCY_ABOVE_COHORT}),
        frozenset({A.DECODE_THROUGHPUT_BELOW_COHORT, A.PHASE_LATENCY_REGRESSION,
                   A.DECODE_THROUGHPUT_DROP, A.SPECULATION_SLOWER_THAN_BASELINE}),
    ),
    "stall": (frozenset({A.DECODING_STALLED}), frozenset()),
    "exporter_down": (frozenset({A.EXPORTER_DOWN}), frozenset()),
    # While the replaced pods' rates still cover the rate window, they are the cohort's median,
    # so the new (broken) pods can also fire the below-cohort alerts: right, and named correctly.
    "bad_rollout": (
        frozenset({A.ACCEPTANCE_RATE_DROP}),
        frozenset({A.COHORT_THROUGHPUT_DROP, A.SPECULATION_SLOWER_THAN_BASELINE,
                   A.ACCEPTANCE_BELOW_COHORT, A.DECODE_THROUGHPUT_BELOW_COHORT}),
    ),
}

#: Fault kinds an engine-only server's own series show: acceptance, from its accepted and drafted
#: counters (or SGLang's gauges). The rest need specobs's plugin: a verify slowdown shows only in
#: phase timing, a stall only against the time of the last cycle (the engines' counters merely
#: stop), and exporter_down breaks a specobs endpoint that such a server does not have (its own
#: endpoint's ``up`` belongs to the engine's job, which no specobs alert reads).
ENGINE_VISIBLE: frozenset[str] = frozenset({"acceptance_collapse", "bad_rollout"})
#: The jobs engine-only servers are scraped under: a cohort alert of one of these jobs is about
#: engine-only servers, never about the plugin's servers of the same model and engine.
_ENGINE_JOBS = frozenset(engine_job(e.name) for e in _engines.ENGINES)

#: MixinConfig overrides for runs of minutes: rate windows of 30 s (10 scrapes at 3 s), a 2 min
#: history ending 20 s ago (read from 15 s averages), ``for`` of 15-30 s. Scrape and evaluate
#: every 3 s with these.
SHORT_WINDOWS: dict[str, str] = {
    "rate_window": "30s",
    "history_window": "2m",
    "history_offset": "20s",
    "history_step": "15s",
    "throughput_drop_for": "20s",
    "cohort_for": "15s",
    "acceptance_drop_for": "15s",
    "slower_than_baseline_for": "30s",
    "phase_regression_for": "30s",
    "stall_after": "15s",
    "stall_for": "10s",
    "exporter_down_for": "15s",
    "target_missing_for": "1m",
    "dropped_records_for": "30s",
}

_COHORT = ("cluster", "namespace", "model_name", "serving_engine")


@dataclass(frozen=True)
class FaultEvent:
    kind: str
    t: float
    servers: tuple[dict[str, str], ...]


def fault_events(records: Iterable[dict[str, Any]]) -> list[FaultEvent]:
    """The fault starts among fleet-sim's event records (restarts and ends are not faults)."""
    out = []
    for rec in records:
        kind, _, phase = rec["kind"].partition(":")
        if phase == "start" and kind in ALERT_MAP:
            out.append(FaultEvent(kind, float(rec["t"]), tuple(rec["servers"])))
    return out


def load_events(path: str | Path) -> list[FaultEvent]:
    """The fault starts from a fleet-sim events file."""
    return fault_events(json.loads(line) for line in Path(path).read_text().splitlines())


def judged(kind: str, server: dict[str, str]) -> bool:
    """Is this fault of this server judged: does some alert have to fire for it? A server's
    ``source`` is ``engine`` when only its engine's series are scraped (older event files have
    none: the plugin)."""
    return server.get("source", "plugin") != "engine" or kind in ENGINE_VISIBLE


def _unit(alert_labels: dict[str, str], server: dict[str, str]) -> bool:
    """Does an alert with these labels name this server (its instance, host or cohort)?"""
    if "instance" in alert_labels:
        return alert_labels["instance"] == server["instance"]
    if "host" in alert_labels:
        return (alert_labels["host"] == server["host"]
                and alert_labels.get("cluster", "") == server["cluster"])
    if not all(alert_labels.get(k, "") == server[k] for k in _COHORT):
        return False
    # Engine-only servers form cohorts of their engine's job, apart from the plugin's servers
    # of the same model and engine.
    job = alert_labels.get("job", "")
    return job == server["job"] if "job" in server else job not in _ENGINE_JOBS


def _unit_key(alert: str, server: dict[str, str], scope: str) -> tuple[str, ...]:
    if scope == "instance":
        return (alert, server["instance"])
    if scope == "host":
        return (alert, server["cluster"], server["host"])
    return (alert, *(server[k] for k in _COHORT), server.get("job", ""))


@dataclass
class AlertScore:
    """Per alert name: true and false positives, expected units and those that fired, delays."""

    alert: str
    true_positives: int = 0
    false_positives: int = 0
    expected: int = 0
    detected: int = 0
    delays_seconds: list[float] = field(default_factory=list)
    false: list[dict[str, str]] = field(default_factory=list)

    @property
    def precision(self) -> float | None:
        fired = self.true_positives + self.false_positives
        return None if fired == 0 else self.true_positives / fired

    @property
    def recall(self) -> float | None:
        return None if self.expected == 0 else self.detected / self.expected


def _scope(alert: str) -> str:
    if alert == A.DECODING_STALLED:
        return "host"
    if alert in (A.ACCEPTANCE_RATE_DROP, A.COHORT_THROUGHPUT_DROP):
        return "cohort"
    return "instance"


def score(firing: Iterable[tuple[dict[str, str], float]], faults: list[FaultEvent]
          ) -> dict[str, AlertScore]:
    """``firing``: (alert labels, first time it was firing) per alert series."""
    scores: dict[str, AlertScore] = {}

    def get(name: str) -> AlertScore:
        return scores.setdefault(name, AlertScore(name))

    first: dict[tuple[str, ...], float] = {}
    for labels, t in firing:
        name = labels["alertname"]
        ok = False
        for fault in faults:
            expected, allowed = ALERT_MAP[fault.kind]
            if name not in expected | allowed or t < fault.t:
                continue
            for server in fault.servers:
                if _unit(labels, server):
                    ok = True
                    key = _unit_key(name, server, _scope(name))
                    first[key] = min(first.get(key, t), t)
        s = get(name)
        if ok:
            s.true_positives += 1
        else:
            s.false_positives += 1
            s.false.append(labels)
    for fault in faults:
        expected, _ = ALERT_MAP[fault.kind]
        for name in expected:
            units = {_unit_key(name, server, _scope(name)) for server in fault.servers
                     if judged(fault.kind, server)}
            s = get(name)
            for key in sorted(units):
                s.expected += 1
                if key in first:
                    s.detected += 1
                    s.delays_seconds.append(first[key] - fault.t)
    return scores


def firing_from_matrix(result: list[dict[str, Any]]) -> list[tuple[dict[str, str], float]]:
    """First firing time per series of a range query of ``ALERTS{alertstate="firing"}``."""
    out = []
    for series in result:
        labels = {k: v for k, v in series["metric"].items()
                  if k not in ("__name__", "alertstate")}
        if series["values"]:
            out.append((labels, float(series["values"][0][0])))
    return out


def first_firing_query(range_seconds: float, step_seconds: float) -> str:
    """PromQL for the first time (Unix seconds) each specobs alert series was firing over the
    last ``range_seconds``, evaluated every ``step_seconds`` (an instant query)."""
    alerts = f'ALERTS{{alertstate="firing", alertname=~"{ALERT_PREFIX}.*"}}'
    return (f"min_over_time(timestamp({alerts})"
            f"[{max(round(range_seconds), 1)}s:{max(round(step_seconds), 1)}s])")


def firing_from_vector(result: list[dict[str, Any]]) -> list[tuple[dict[str, str], float]]:
    """(alert labels, first firing time) per series of :func:`first_firing_query`'s answer."""
    out = []
    for series in result:
        labels = {k: str(v) for k, v in (series.get("metric") or {}).items()
                  if k not in ("__name__", "alertstate")}
        if "alertname" in labels:
            out.append((labels, float(series["value"][1])))
    return out


def score_table(scores: dict[str, AlertScore], faults: list[FaultEvent]) -> str:
    """The scores as text: per alert fired or expected, precision, recall and time to fire."""
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.0%}"

    lines = [f"{len(faults)} faults scored; {'alert':<36} {'TP':>4} {'FP':>4} "
             f"{'precision':>9} {'recall':>7}  time to fire"]
    tp = fp = expected = detected = 0
    for name in sorted(scores):
        s = scores[name]
        tp, fp = tp + s.true_positives, fp + s.false_positives
        expected, detected = expected + s.expected, detected + s.detected
        delay = (f"{min(s.delays_seconds):.0f}-{max(s.delays_seconds):.0f} s"
                 if s.delays_seconds else "-")
        lines.append(f"  {name:<52} {s.true_positives:>4} {s.false_positives:>4} "
                     f"{pct(s.precision):>9} {pct(s.recall):>7}  {delay}")
    total = AlertScore("all", tp, fp, expected, detected)
    lines.append(f"  {'all':<52} {tp:>4} {fp:>4} {pct(total.precision):>9} "
                 f"{pct(total.recall):>7}")
    unjudged = sorted({(f.kind, s["instance"]) for f in faults for s in f.servers
                       if not judged(f.kind, s)})
    if unjudged:
        lines.append("  not judged (engine-only servers; their engine's series cannot show it): "
                     + ", ".join(f"{kind} on {instance}" for kind, instance in unjudged))
    return "\n".join(lines)
