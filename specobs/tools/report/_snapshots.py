"""The report's snapshot file: scrapes saved as JSON Lines by ``report --save`` and read back.

The first line names the format and version and the source; each further line is one scrape
(its time, the seconds it took, and its specobs samples or the error). :func:`load_snapshots`
reads a file of any size in bounded memory: lines past :data:`MAX_LINE_BYTES` are refused, and a
long file is thinned evenly to at most :data:`MAX_SNAPSHOTS`. Every source of
:mod:`specobs.tools.report._data` reports a failure as :class:`RunError`, defined here with the
:class:`Snapshot` each scrape becomes.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from specobs.tools import _client
from specobs.tools import _scrape as scr

__all__ = [
    "MAX_KEPT_BYTES", "MAX_LINES", "MAX_LINE_BYTES", "MAX_SNAPSHOTS", "SNAPSHOT_FORMAT",
    "SNAPSHOT_VERSION", "RunError", "Snapshot", "load_snapshots", "replacing", "save_snapshots",
]  # fmt: skip

#: The first line of a snapshot file names its format and version.
SNAPSHOT_FORMAT = "specobs-snapshots"
SNAPSHOT_VERSION = 1


class RunError(Exception):
    """A source gave nothing to report; ``str()`` is one line for the user."""



@dataclass(frozen=True)
class Snapshot:
    """One scrape: Unix time, the seconds it took, and its specobs samples (or the error)."""

    unix: float
    series: scr.Series | None
    fetch_seconds: float = 0.0
    error: str = ""


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
