"""Where ``specobs report`` gets its numbers: a :class:`Run` of per-window deltas and one total.

Three sources, one shape:

* **A live endpoint** (:func:`sample_endpoint`): scraped every ``interval`` seconds for
  ``duration`` seconds. Window *i* is ``difference(scrape[i], scrape[i+1])`` and the total is
  ``difference(first, last)``, exactly what ``specobs top`` computes between two polls.
* **A snapshot file** (:func:`load_snapshots`, written by :func:`save_snapshots`): the same
  scrapes recorded as JSON Lines, so a run can be reported (or compared) later.
* **A Prometheus server and a time range** (:func:`prometheus_run`): window *i* is
  ``increase(...[step])`` evaluated at the end of each step (what the recording rules and
  ``specobs top --prometheus --window STEP`` read), and the total is ``increase()`` over the
  whole range evaluated at its end (``top --prometheus --window RANGE`` at that moment).

Every window and the total become :class:`specobs.tools._breakdown.Breakdown` through
:func:`specobs.tools._breakdown.breakdown`, so the report has no formula of its own.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, Any

from specobs import catalog
from specobs.tools import _breakdown as bd
from specobs.tools import _client
from specobs.tools import _diagnosis as dg
from specobs.tools import _promapi as pa
from specobs.tools import _scrape as scr
from specobs.tools.report._snapshots import MAX_KEPT_BYTES as MAX_KEPT_BYTES
from specobs.tools.report._snapshots import MAX_LINE_BYTES as MAX_LINE_BYTES
from specobs.tools.report._snapshots import MAX_LINES as MAX_LINES
from specobs.tools.report._snapshots import MAX_SNAPSHOTS as MAX_SNAPSHOTS
from specobs.tools.report._snapshots import SNAPSHOT_FORMAT as SNAPSHOT_FORMAT
from specobs.tools.report._snapshots import SNAPSHOT_VERSION as SNAPSHOT_VERSION
from specobs.tools.report._snapshots import RunError as RunError
from specobs.tools.report._snapshots import Snapshot as Snapshot
from specobs.tools.report._snapshots import load_snapshots as load_snapshots
from specobs.tools.report._snapshots import replacing as replacing
from specobs.tools.report._snapshots import save_snapshots as save_snapshots

__all__ = [
    "SNAPSHOT_FORMAT",
    "PrometheusRange",
    "Run",
    "RunError",
    "Window",
    "batch_windows",
    "joined",
    "load_snapshots",
    "prometheus_run",
    "prometheus_windows",
    "run_from_scrapes",
    "sample_endpoint",
    "save_snapshots",
]

#: Gauges a report reads besides the counters (differenced) of ``COUNTER_SERIES``.
GAUGE_NAMES: tuple[str, ...] = (
    catalog.INFO.name,
    catalog.BASELINE_SEQUENCE_TOKENS.name,
    catalog.SAMPLING_INTERVAL.name,
    catalog.OVERHEAD_RATIO.name,
    catalog.REQUESTS_RUNNING.name,
    catalog.REQUESTS_WAITING.name,
)



@dataclass(frozen=True)
class Window:
    """One window of a run: its end (seconds since the run's start) and its deltas."""

    end_seconds: float
    delta: scr.Delta
    breakdown: bd.Breakdown


@dataclass
class Run:
    """What one source gave: per-window breakdowns, the whole-run total and health notes."""

    name: str
    source: str
    start_unix: float
    end_unix: float
    windows: list[Window]
    total: bd.Breakdown
    total_delta: scr.Delta
    #: Seconds at which a sample failed (a scrape error, a counter reset), and why.
    failures: list[tuple[float, str]] = field(default_factory=list)
    #: Seconds each scrape took (live sampling only), by window end.
    scrape_seconds: list[tuple[float, float]] = field(default_factory=list)
    #: ``up`` per server over time (Prometheus only): {instance: [(seconds, value)]}.
    up: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: The file its snapshots were saved to (``report --save``; live sampling only).
    saved_to: str | None = None

    @property
    def duration_seconds(self) -> float:
        return self.end_unix - self.start_unix

    def servers(self) -> list[str]:
        """The ``instance`` labels seen (one unnamed server for a direct endpoint)."""
        names = {d.get("instance", "") for d in self.total_delta.counters.labels(
            catalog.CYCLES.name)}
        return sorted(n for n in names if n) or [""]


def only(series: scr.Series, label: str, value: str) -> scr.Series:
    """The samples of ``series`` whose ``label`` is ``value`` (per-server views)."""
    return scr.Series({k: v for k, v in series.samples.items() if dict(k[1]).get(label) == value})


def per_server(delta: scr.Delta, instance: str) -> bd.Breakdown:
    """The breakdown of one server (``instance`` label) of a multi-server delta."""
    if not instance:
        return bd.breakdown(delta)
    return bd.breakdown(scr.Delta(
        only(delta.counters, "instance", instance), only(delta.gauges, "instance", instance),
        delta.elapsed_seconds,
    ))


def joined(deltas: Sequence[scr.Delta]) -> scr.Delta:
    """Consecutive deltas as one: the counters added up, the gauges as the last one read them,
    the seconds summed."""
    if len(deltas) == 1:
        return deltas[0]
    counters: dict[Any, float] = {}
    for d in deltas:
        for key, value in d.counters.samples.items():
            counters[key] = counters.get(key, 0.0) + value
    return scr.Delta(scr.Series(counters), deltas[-1].gauges,
                     math.fsum(d.elapsed_seconds for d in deltas))


def batch_windows(windows: Sequence[Window],
                  min_cycles: float = dg.MIN_SPEEDUP_CYCLES) -> list[dg.Window]:
    """The windows of one server that the batch threshold is fitted over (``diagnose(...,
    batch_windows=...)``, docs/diagnosis.md): each window as it is when it holds ``min_cycles``
    cycles (a shorter one is no point), else joined with the windows after it until the join
    does. A join never spans two batch sizes: a window whose mean batch is more than
    ``BATCH_SAME_FACTOR`` from the join's starts a new one, and a join left short of
    ``min_cycles`` is dropped, as are windows without cycles. A join's gauges, the baseline
    among them, are those at its end."""
    out: list[dg.Window] = []
    group: list[scr.Delta] = []
    cycles = sequences = 0.0

    def close() -> None:
        nonlocal group, cycles, sequences
        if group and cycles >= min_cycles:
            out.append(dg.window(joined(group)))
        group, cycles, sequences = [], 0.0, 0.0

    for w in windows:
        b = w.breakdown
        batch = b.mean_batch_size
        if not b.cycles > 0 or batch is None or not batch > 0:
            continue
        if group:
            mean = sequences / cycles
            if max(batch, mean) > dg.BATCH_SAME_FACTOR * min(batch, mean):
                close()
        group.append(w.delta)
        cycles += b.cycles
        sequences += batch * b.cycles
        if cycles >= min_cycles:
            close()
    close()
    return out


# -- snapshots (a live endpoint or a file) --------------------------------------------------------




def run_from_scrapes(name: str, source: str, snapshots: list[Snapshot]) -> Run:
    """Windows between consecutive good scrapes; raises :class:`RunError` with fewer than two."""
    good = [s for s in snapshots if s.series is not None]
    if len(good) < 2:
        failed = [s.error for s in snapshots if s.error]
        why = f" (last error: {failed[-1]})" if failed else ""
        raise RunError(
            f"{source}: {len(good)} good sample(s) of {len(snapshots)}; a report needs at least "
            f"two{why}"
        )
    t0 = good[0].unix
    failures = [(s.unix - t0, s.error) for s in snapshots if s.series is None]
    windows: list[Window] = []
    scrape_seconds = [(s.unix - t0, s.fetch_seconds) for s in good if s.fetch_seconds > 0]
    prev = good[0]
    base = good[0]
    for cur in good[1:]:
        a = scr.Scrape(prev.series or scr.Series(), prev.unix)
        b = scr.Scrape(cur.series or scr.Series(), cur.unix)
        delta = scr.difference(a, b)
        if isinstance(delta, scr.CounterReset):
            # The server restarted: the run restarts from here (its earlier part is lost).
            failures.append((cur.unix - t0, str(delta)))
            windows = []
            base = cur
        else:
            windows.append(Window(cur.unix - t0, delta, bd.breakdown(delta)))
        prev = cur
    total = scr.difference(
        scr.Scrape(base.series or scr.Series(), base.unix),
        scr.Scrape(good[-1].series or scr.Series(), good[-1].unix),
    )
    if isinstance(total, scr.CounterReset) or not windows:
        raise RunError(f"{source}: no two consecutive samples without a counter reset")
    return Run(name, source, base.unix, good[-1].unix, windows, bd.breakdown(total), total,
               failures, scrape_seconds)


def _specobs_only(series: scr.Series) -> scr.Series:
    return scr.Series({k: v for k, v in series.samples.items() if k[0].startswith("specobs_")})


class Progress:
    """A one-line progress indication on stderr: redrawn in place on a terminal, else a line
    every ``every_seconds``."""

    def __init__(self, stream: IO[str] | None = None, every_seconds: float = 10.0) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every_seconds
        self._last = -math.inf

    def update(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
        elif force or now - self._last >= self.every:
            self.stream.write(text + "\n")
        else:
            return
        self._last = now
        self.stream.flush()

    def done(self, text: str) -> None:
        self.stream.write(("\r\x1b[2K" if self.tty else "") + text + "\n")
        self.stream.flush()


def sample_endpoint(
    client: Any,
    url: str,
    duration_seconds: float,
    interval_seconds: float,
    *,
    limits: _client.Limits = _client.DEFAULT_LIMITS,
    progress: Callable[[str], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[Snapshot]:
    """Scrape ``url`` every ``interval_seconds`` for ``duration_seconds`` (one more scrape at the
    end). The first scrape must succeed: an unreachable or non-specobs endpoint raises
    :class:`RunError` at once; later failures are recorded and sampling goes on."""
    shown = _client.display_url(url)
    snapshots: list[Snapshot] = []
    started = time.monotonic()
    n = max(1, math.ceil(duration_seconds / interval_seconds))
    for i in range(n + 1):
        due = started + i * interval_seconds
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        t = time.time()
        m = time.monotonic()
        try:
            got = scr.scrape(client, url, limits=limits)
        except scr.ScrapeError as exc:
            if i == 0:
                raise RunError(str(exc)) from None
            snapshots.append(Snapshot(t, None, time.monotonic() - m, str(exc)))
        else:
            snapshots.append(Snapshot(t, _specobs_only(got.series), time.monotonic() - m))
        if progress is not None:
            failed = sum(1 for s in snapshots if s.series is None)
            elapsed = min(duration_seconds, time.monotonic() - started)
            bar = "#" * round(20 * i / n)
            progress(
                f"sampling {shown} [{bar:<20}] {elapsed:4.0f}/{duration_seconds:g} s, "
                f"{len(snapshots) - failed} samples" + (f", {failed} failed" if failed else "")
            )
        if stop is not None and stop():
            break
    return snapshots



# -- Prometheus and a time range ------------------------------------------------------------------


@dataclass(frozen=True)
class PrometheusRange:
    """What a report reads from a Prometheus server: the series of ``selector`` over
    ``[start, end]`` (Unix seconds) in steps of ``step`` seconds, through ``client`` within
    ``limits``."""

    client: Any
    base_url: str
    selector: str
    start: float
    end: float
    step: float
    limits: _client.Limits = _client.DEFAULT_LIMITS


def _prom_range(r: PrometheusRange, promql: str, start: float) -> list[dict[str, Any]]:
    url = r.base_url.rstrip("/") + "/api/v1/query_range"
    shown = _client.display_url(r.base_url)
    params = {"query": promql, "start": f"{start:.3f}", "end": f"{r.end:.3f}",
              "step": f"{r.step:g}"}
    try:
        response = _client.get(r.client, url, params=params, limits=r.limits,
                             headers={"Accept": "application/json"})
    except scr.ScrapeError as exc:
        raise RunError(f"cannot query Prometheus at {shown}: {exc}") from None
    try:
        payload = json.loads(response.body)
    except ValueError:
        raise RunError(f"{shown} is not a Prometheus server: /api/v1/query_range answered "
                       f"HTTP {response.status_code} with a non-JSON body") from None
    if not isinstance(payload, dict) or payload.get("status") != "success":
        error = payload.get("error") if isinstance(payload, dict) else None
        raise RunError(f"Prometheus at {shown} rejected {promql!r} "
                       f"(HTTP {response.status_code}): {error or 'no error text'}")
    data = payload.get("data") or {}
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise RunError(f"Prometheus at {shown} answered {promql!r} with no matrix")
    return result


def _add_matrix(
    frames: dict[float, scr.Series], name: str, result: list[dict[str, Any]]
) -> None:
    for item in result:
        labels = {k: str(v) for k, v in (item.get("metric") or {}).items() if k != "__name__"}
        for point in item.get("values") or []:
            try:
                t, value = float(point[0]), float(point[1])
            except (IndexError, TypeError, ValueError):
                continue
            if math.isnan(value):
                continue
            frames.setdefault(round(t, 3), scr.Series()).add(name, labels, value)


def _frames(r: PrometheusRange) -> tuple[dict[float, scr.Series], dict[float, scr.Series]]:
    """Counters (``increase(...[step])``) and gauges (as they are) at each ``step`` from
    ``start + step`` to ``end``, by evaluation time."""
    window = pa.window_text(r.step)
    first = r.start + r.step
    counters: dict[float, scr.Series] = {}
    for metric in sorted(scr.COUNTER_SERIES):
        promql = f"increase({metric}{{{r.selector}}}[{window}])"
        _add_matrix(counters, metric, _prom_range(r, promql, first))
    gauges: dict[float, scr.Series] = {}
    for metric in GAUGE_NAMES:
        _add_matrix(gauges, metric, _prom_range(r, f"{metric}{{{r.selector}}}", first))
    return counters, gauges


def _windows(counters: dict[float, scr.Series], gauges: dict[float, scr.Series],
             r: PrometheusRange) -> list[Window]:
    windows: list[Window] = []
    for t in sorted(counters):
        delta = scr.Delta(counters[t], gauges.get(t, scr.Series()), r.step)
        windows.append(Window(t - r.start, delta, bd.breakdown(delta)))
    return windows


def prometheus_windows(r: PrometheusRange) -> list[Window]:
    """The windows of the range as :func:`prometheus_run` reads them, without the run's
    total: ``increase(...[step])`` and the gauges at each ``step`` from ``start + step`` to
    ``end`` (``end_seconds`` from ``start``), where Prometheus holds counters. Raises
    :class:`RunError` when Prometheus fails."""
    return _windows(*_frames(r), r)


def prometheus_run(r: PrometheusRange, *, name: str = "") -> Run:
    """A run from a Prometheus server over the range; see the module docstring. Raises
    :class:`RunError` for an unreachable server or an empty range."""
    start, end, selector = r.start, r.end, r.selector
    if not end > start:
        raise RunError(f"the time range is empty: end {end:.0f} is not after start {start:.0f}")
    r = replace(r, step=min(r.step, end - start))
    counters, gauges = _frames(r)
    up_matrix = _prom_range(r, f"up{{{selector}}}", start)
    source = f"{_client.display_url(r.base_url)} {{{selector}}}"
    if not any(s.has(catalog.CYCLES.name) for s in counters.values()):
        seen = "" if gauges else (" and no specobs series at all: check the selector and that "
                                  "Prometheus scrapes the specobs endpoint")
        raise RunError(
            f"Prometheus at {_client.display_url(r.base_url)} has no "
            f"{catalog.CYCLES.name}{{{selector}}} samples between "
            f"{_iso(start)} and {_iso(end)}{seen}"
        )
    windows = _windows(counters, gauges, r)
    try:
        total_delta = pa.prometheus_delta(r.client, r.base_url, selector, end - start,
                                           limits=r.limits, at=end)
    except scr.ScrapeError as exc:
        raise RunError(str(exc)) from None
    up: dict[str, list[tuple[float, float]]] = {}
    for item in up_matrix:
        instance = str((item.get("metric") or {}).get("instance", ""))
        up[instance] = [(float(p[0]) - start, float(p[1])) for p in item.get("values") or []]
    return Run(name or source, source, start, end, windows, bd.breakdown(total_delta),
               total_delta, up=up)


def _iso(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def parse_time(text: str, now: float) -> float:
    """``now``, Unix seconds, RFC 3339 (``2024-05-01T10:00:00Z``) or ``-15m`` (before now)."""
    raw = text.strip()
    if raw == "now":
        return now
    if raw.startswith("-"):
        return now - pa.parse_window(raw[1:])
    try:
        return float(raw)
    except ValueError:
        pass
    from datetime import datetime, timezone

    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"bad time {text!r}; expected now, Unix seconds, RFC 3339 such as "
            "2024-05-01T10:00:00Z, or a duration before now such as -15m"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()

