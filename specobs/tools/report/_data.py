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

import contextlib
import gzip
import json
import math
import os
import re
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, Any

from specobs import catalog
from specobs.tools import _breakdown as bd
from specobs.tools import _client
from specobs.tools import _diagnosis as dg
from specobs.tools import _promapi as pa
from specobs.tools import _scrape as scr

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

#: The first line of a snapshot file names its format and version.
SNAPSHOT_FORMAT = "specobs-snapshots"
SNAPSHOT_VERSION = 1

#: Gauges a report reads besides the counters (differenced) of ``COUNTER_SERIES``.
GAUGE_NAMES: tuple[str, ...] = (
    catalog.INFO.name,
    catalog.BASELINE_SEQUENCE_TOKENS.name,
    catalog.SAMPLING_INTERVAL.name,
    catalog.OVERHEAD_RATIO.name,
    catalog.REQUESTS_RUNNING.name,
    catalog.REQUESTS_WAITING.name,
)


class RunError(Exception):
    """A source gave nothing to report; ``str()`` is one line for the user."""


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


@dataclass(frozen=True)
class Snapshot:
    """One scrape: Unix time, the seconds it took, and its specobs samples (or the error)."""

    unix: float
    series: scr.Series | None
    fetch_seconds: float = 0.0
    error: str = ""


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


@contextlib.contextmanager
def replacing(path: str) -> Iterator[str]:
    """A name beside ``path`` to write the new file under: it replaces ``path`` once the block
    ends without an error, so a reader never sees half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    yield tmp
    os.replace(tmp, path)


def save_snapshots(path: str, source: str, snapshots: Iterable[Snapshot]) -> None:
    """Write snapshots as JSON Lines (gzip when ``path`` ends in ``.gz``), atomically.

    The file is meant to be shared: credentials in a ``source`` URL are left out."""
    opener: Any = gzip.open if path.endswith(".gz") else open
    with replacing(path) as tmp, opener(tmp, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION,
                            "source": _client.display_url(source)}) + "\n")
        for s in snapshots:
            row: dict[str, Any] = {"t": round(s.unix, 6), "fetch_seconds": round(
                s.fetch_seconds, 6)}
            if s.series is None:
                row["error"] = s.error
            else:
                row["samples"] = [[name, dict(labels), value]
                                  for (name, labels), value in sorted(s.series.samples.items())]
            f.write(json.dumps(row, separators=(",", ":")) + "\n")


#: Most bytes one line of a snapshot file may hold (one scrape: the tools read at most
#: ``DEFAULT_MAX_BYTES`` of an exposition, and its JSON is a few times that at worst).
MAX_LINE_BYTES = 64 * 1024 * 1024
#: Most snapshots a report keeps from one file: a longer file (a day of ``--save`` holds tens
#: of thousands) is thinned evenly to between half this and this, its first and last kept, so
#: memory and the report's time stay bounded (a report's cost grows with its windows: a day in
#: a few hundred windows of minutes each).
MAX_SNAPSHOTS = 360
#: Most bytes of rows held while a file is read (rows are parsed once the thinning is done).
MAX_KEPT_BYTES = 256 * 1024 * 1024
#: Most lines a snapshot file may have (blank ones included): eleven days of one scrape a
#: second. Bounds the time a file of tiny lines takes, as the bytes bound cannot.
MAX_LINES = 1_000_000
#: Sample values a specobs endpoint can serve: finite, and within what an exporter encodes as a
#: 64-bit integer (specobs refuses counts that would pass it).
_MAX_SAMPLE = float(2**63)
#: A row's time, read without parsing the row (``save_snapshots`` writes it first).
_ROW_TIME = re.compile(rb'^\s*\{"t":\s*(-?[0-9][0-9.eE+-]*)')


def load_snapshots(
    path: str, *, max_bytes: int = _client.DEFAULT_MAX_FILE_BYTES,
    max_snapshots: int = MAX_SNAPSHOTS, note: Callable[[str], None] | None = None,
) -> tuple[str, list[Snapshot]]:
    """Read a file :func:`save_snapshots` wrote; returns ``(source, snapshots)``. Raises
    :class:`RunError` with the file and line for anything else.

    Read in one pass, line by line: at most ``max_bytes`` in all (after decompression) and
    :data:`MAX_LINE_BYTES` per line, so a gzip bomb or a file of one endless line stops at the
    bound. Rows are parsed only while they are kept: past ``max_snapshots`` the file is thinned
    evenly (every second row, then every fourth, ...; the last row is always kept) and
    ``note`` is told how many were read and how many kept. Every row's time must come after
    the one before it, and every sample must be finite and below 2**63."""
    snapshots: list[Snapshot] = []
    try:
        with _open_snapshot_file(path) as raw:
            lines = _bounded_lines(raw, path, max_bytes)
            header_line = next(lines, (1, b""))[1]
            try:
                header = json.loads(header_line)
            except (ValueError, RecursionError):
                header = None
            if not isinstance(header, dict) or header.get("format") != SNAPSHOT_FORMAT:
                raise RunError(
                    f"{path} is not a specobs snapshot file (line 1 should name format "
                    f"{SNAPSHOT_FORMAT!r}; write one with specobs report --save)"
                )
            if header.get("version") != SNAPSHOT_VERSION:
                raise RunError(f"{path}: snapshot format version "
                               f"{str(header.get('version'))[:40]!r} is not supported "
                               f"(expected {SNAPSHOT_VERSION})")
            snapshots, read = _thinned_rows(path, lines, max_snapshots)
    except FileNotFoundError:
        raise RunError(f"{path}: no such file") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise RunError(f"{path}: cannot read it ({exc})") from None
    if note is not None and read > len(snapshots):
        note(f"{path}: {read:,} snapshots; the report uses {len(snapshots):,} of them, evenly "
             f"spaced (at most {max_snapshots:,} are kept), the first and last included")
    # A file written before sources were saved without credentials may still carry them.
    return _client.display_url(str(header.get("source") or path)[:2048]), snapshots


def _open_snapshot_file(path: str) -> Any:
    """The file as bytes, inflated as it is read when its name ends in ``.gz``."""
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _bounded_lines(f: Any, path: str, max_bytes: int) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of ``f``, each read with a bound: a line over
    :data:`MAX_LINE_BYTES`, or more than ``max_bytes`` read in all, raises :class:`RunError`
    before more is read."""
    total = 0
    lineno = 0
    while True:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        lineno += 1
        total += len(line)
        if lineno > MAX_LINES:
            raise RunError(f"{path} has more than {MAX_LINES:,} lines; not a snapshot file "
                           f"written by specobs report --save (one line per scrape)")
        if total > max_bytes:
            raise RunError(
                f"{path} holds more than {_client.format_bytes(max_bytes)} (after "
                f"decompression; line {lineno}); give --max-bytes to read more of it")
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            raise RunError(f"{path}: line {lineno} is longer than "
                           f"{_client.format_bytes(MAX_LINE_BYTES)} (one snapshot is a scrape, "
                           f"far less); not a snapshot file")
        yield lineno, line


def _thinned_rows(path: str, lines: Iterator[tuple[int, bytes]], most: int
                  ) -> tuple[list[Snapshot], int]:
    """The rows of ``lines``, checked to be in time order, thinned to at most ``most`` (plus the
    last) and parsed, and how many rows there were. Rows are kept as read (bytes) until the end,
    and parsed only then: a row dropped by the thinning costs its reading alone."""
    kept: list[tuple[int, int, bytes]] = []  # (row, line number, line)
    kept_bytes = 0
    stride = 1
    rows = 0
    last_t = -math.inf
    last_line = 0
    tail: tuple[int, int, bytes] | None = None  # the latest row
    for lineno, line in lines:
        if not line.strip():
            continue
        t = _row_time(line)
        if t is not None:
            if not t > last_t:
                raise RunError(f"{path}: line {lineno} has time {t!r}, not after line "
                               f"{last_line}'s {last_t!r}; a snapshot file's rows are in time "
                               f"order")
            last_t, last_line = t, lineno
        tail = (rows, lineno, line)
        if rows % stride == 0:
            kept.append(tail)
            kept_bytes += len(line)
            while len(kept) > most or (kept_bytes > MAX_KEPT_BYTES and len(kept) > 2):
                stride *= 2
                kept = [k for k in kept if k[0] % stride == 0]
                kept_bytes = sum(len(k[2]) for k in kept)
        rows += 1
    if tail is not None and (not kept or kept[-1][0] != tail[0]):
        kept.append(tail)
    out: list[Snapshot] = []
    for _, lineno, line in kept:
        snap = _snapshot_from_json(path, lineno, line)
        if out and not snap.unix > out[-1].unix:  # a row whose start did not name its time
            raise RunError(f"{path}: line {lineno} has time {snap.unix!r}, not after "
                           f"{out[-1].unix!r}; a snapshot file's rows are in time order")
        out.append(snap)
    return out, rows


def _row_time(line: bytes) -> float | None:
    """A row's time from its first bytes, or ``None`` (not written by :func:`save_snapshots`,
    or not a number there: the row is checked whole if it is ever parsed)."""
    m = _ROW_TIME.match(line)
    try:
        return float(m.group(1)) if m else None
    except ValueError:
        return None


class _BadValue(Exception):
    """A sample value no specobs endpoint serves."""


def _snapshot_from_json(path: str, lineno: int, line: str | bytes) -> Snapshot:
    try:
        row = json.loads(line)
        t = float(row["t"])
        fetch = float(row.get("fetch_seconds", 0.0))
        error = str(row["error"])[:1000] if "error" in row else None
        series = scr.Series()
        for name, labels, value in row["samples"] if error is None else ():
            if not isinstance(name, str) or not isinstance(labels, dict):
                raise TypeError("bad sample")
            number = float(value)
            if not abs(number) < _MAX_SAMPLE:  # also NaN
                raise _BadValue(f"sample {name[:80]} has value {number!r}; a specobs endpoint "
                                f"serves finite values below 2**63")
            series.add(name, {str(k): str(v) for k, v in labels.items()}, number)
    except _BadValue as exc:
        raise RunError(f"{path}: line {lineno}: {exc}") from None
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise RunError(f"{path}: line {lineno} is not a snapshot ({type(exc).__name__}: "
                       f"{str(exc)[:80]})") from None
    if not math.isfinite(t):
        raise RunError(f"{path}: line {lineno} has a bad time {t!r}")
    if not 0.0 <= fetch < 86400.0:  # also NaN
        raise RunError(f"{path}: line {lineno} has a bad scrape time {fetch!r}")
    if error is not None:
        return Snapshot(t, None, fetch, error)
    return Snapshot(t, series, fetch)


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
