"""``specobs report``: the command (its flags, its sources, writing the file, ``--json``); the
package docstring (:mod:`specobs.tools.report`) shows the command lines and what a report holds.

Sources are read by :mod:`specobs.tools.report._data`. Errors (an unreachable endpoint, an empty
range, a bad file) are one line on stderr and exit status 1; bad flags exit 2. Credentials in a
URL are sent as HTTP Basic authentication; the report, the ``--save`` file and every message
show the URL without them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from specobs.tools import _client
from specobs.tools import _promapi as pa
from specobs.tools import _scrape as scr
from specobs.tools.report import _data as data
from specobs.tools.report import _stats as stats
from specobs.tools.report._page import compare_changes, render_compare, render_run, run_findings
from specobs.tools.report._tables import fmt

__all__ = ["REGRESSION_EXIT", "add_arguments", "report_json", "run"]

REGRESSION_EXIT = 3

_PROG = "specobs report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specobs report``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "sources:\n"
        "  --from URL       sample a live specobs /metrics endpoint for --duration seconds\n"
        "  --from FILE      a snapshot file written earlier with --save\n"
        "  --prometheus URL a Prometheus server over --start/--end (or --last)\n"
        "  --compare A B    two sources: URLs or files, or with --prometheus two selectors\n"
        "                   ('{instance=\"a:9477\"}'), two ranges (START..END) or both\n"
        "                   (SELECTOR@START..END)\n"
        "\n"
        "A compared metric is flagged when Welch's t-test over the runs' per-window values\n"
        "rejects equal means at --alpha AND the whole-run values differ by at least\n"
        "--min-change (docs/report.md).\n"
        "\n"
        "exit status: 0 the report was written (with --compare: B is not worse than A);\n"
        "3 with --compare, B regressed (acceptance or throughput down, a phase, the cycle\n"
        "or the exporter's cost up; named on stderr, the report written); 1 an error;\n"
        "2 a usage error."
    )
    parser.add_argument("--from", dest="source", metavar="URL|FILE", default=None,
                        help="a specobs /metrics URL to sample, or a snapshot file (--save)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                        help="compare two sources side by side (see below)")
    parser.add_argument("-o", "--output", default="specobs-report.html", metavar="FILE",
                        help="the HTML file to write (default: specobs-report.html)")
    parser.add_argument("--duration", type=float, default=60.0, metavar="SECONDS",
                        help="how long to sample a live endpoint (default: 60)")
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between scrapes of a live endpoint; one window each "
                             "(default: 2)")
    parser.add_argument("--save", metavar="FILE", default=None,
                        help="also write the scrapes of a live endpoint to FILE (JSON Lines; "
                             ".gz compresses) to report or compare later; with --compare, "
                             "-a and -b are added before the suffix")
    parser.add_argument("--prometheus", metavar="URL", default=None,
                        help="read from a Prometheus server (increase() per --step)")
    parser.add_argument("--selector", default="",
                        help="label matchers for --prometheus, e.g. '{job=\"specobs\"}'")
    parser.add_argument("--start", default=None, metavar="TIME",
                        help="range start: Unix seconds, RFC 3339, or -30m (before now)")
    parser.add_argument("--end", default=None, metavar="TIME",
                        help="range end (default: now)")
    parser.add_argument("--last", default=None, metavar="DURATION",
                        help="range: the last DURATION before --end, e.g. 30m (default: 15m)")
    parser.add_argument("--step", default=None, metavar="DURATION",
                        help="window length with --prometheus (default: range / 60, at least "
                             "15s)")
    parser.add_argument("--names", nargs=2, metavar=("A", "B"), default=None,
                        help="names of the two runs of --compare (default: the sources)")
    parser.add_argument("--title", default=None, help="the report's title")
    parser.add_argument("--alpha", type=float, default=0.01, choices=(0.01, 0.05),
                        help="significance level of the per-window Welch test (default: 0.01)")
    parser.add_argument("--min-change", type=float, default=0.10, metavar="FRACTION",
                        help="smallest relative change flagged (default: 0.10)")
    parser.add_argument("--json", action="store_true",
                        help="also print one JSON object on stdout: each run's summary and, for "
                             "one run, its findings, for --compare every metric's verdict and "
                             "the regressions (the exit status is the same)")
    _client.add_limit_arguments(parser, files=True)


# -- running --------------------------------------------------------------------------------------


class _Usage(Exception):
    pass


def _usage(message: str) -> int:
    print(f"{_PROG}: {message}", file=sys.stderr)
    return 2


def _is_url(text: str) -> bool:
    # host:port[/path], or user:password@host:port[/path] (normalize_url adds http://).
    return "://" in text or re.match(r"^([^/@]*@)?[\w.\-\[\]:]+:\d+(/.*)?$", text) is not None


def _save_path(base: str, suffix: str) -> str:
    if not suffix:
        return base
    stem, ext = base, ""
    for e in (".jsonl.gz", ".jsonl", ".json.gz", ".json", ".gz"):
        if base.endswith(e):
            stem, ext = base[: -len(e)], e
            break
    return f"{stem}-{suffix}{ext}"


class _Progress:
    """One progress line for one or two concurrent samplings."""

    def __init__(self) -> None:
        self.lines: dict[str, str] = {}
        self.lock = threading.Lock()
        self.out = data.Progress()

    def reporter(self, key: str) -> Any:
        def report(text: str) -> None:
            with self.lock:
                self.lines[key] = text
                self.out.update(" | ".join(self.lines[k] for k in sorted(self.lines)))
        return report

    def done(self, text: str) -> None:
        with self.lock:
            self.out.done(text)


def _load_source(
    spec: str, args: argparse.Namespace, client: Any, name: str, save_suffix: str,
    progress: _Progress,
) -> data.Run:
    if os.path.exists(spec) and not _is_url(spec):
        source, snapshots = data.load_snapshots(spec, max_bytes=_client.file_limit(args),
                                                note=progress.done)
        return data.run_from_scrapes(name or os.path.basename(spec), source, snapshots)
    if not _is_url(spec):
        raise data.RunError(f"{spec}: no such file (and not a URL such as "
                            "http://127.0.0.1:9477/metrics)")
    try:
        url = scr.normalize_url(spec)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    snapshots = data.sample_endpoint(
        client, url, args.duration, args.interval, limits=_client.limits_from(args),
        progress=progress.reporter(save_suffix or "run"),
    )
    # The report and the snapshot file are shared: credentials stay out of both.
    shown = _client.display_url(url)
    saved = _save_path(args.save, save_suffix) if args.save else None
    if saved is not None:  # before the run is made: a sampling that gave no run is kept too
        data.save_snapshots(saved, shown, snapshots)
    run = data.run_from_scrapes(name or shown, shown, snapshots)
    run.saved_to = saved
    return run


def _time_range(args: argparse.Namespace, spec: str | None, now: float) -> tuple[float, float]:
    if spec:
        lo, sep, hi = spec.partition("..")
        if not sep:
            raise _Usage(f"bad range {spec!r}; expected START..END, e.g. -30m..-15m")
        return data.parse_time(lo, now), data.parse_time(hi, now)
    end = data.parse_time(args.end, now) if args.end else now
    if args.start:
        if args.last:
            raise _Usage("give --start or --last, not both")
        return data.parse_time(args.start, now), end
    return end - pa.parse_window(args.last or "15m"), end


def _prometheus_source(
    spec: str | None, args: argparse.Namespace, client: Any, base: str, name: str
) -> data.Run:
    selector_text, range_text = args.selector, None
    if spec is not None:
        if "@" in spec:
            selector_text, _, range_text = spec.rpartition("@")
        elif spec.strip().startswith("{"):
            selector_text = spec
        else:
            range_text = spec
    try:
        selector = pa.normalize_selector(selector_text)
        start, end = _time_range(args, range_text, time.time())
        step = pa.parse_window(args.step) if args.step else max(15.0, (end - start) / 60)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    rng = data.PrometheusRange(client, base, selector, start, end, step, _client.limits_from(args))
    return data.prometheus_run(rng, name=name or spec or "")


def _bad_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line's sources and windows, or ``None``."""
    if (args.source is None) == (args.compare is None) and args.prometheus is None:
        return "give --from URL|FILE, --compare A B, or --prometheus URL"
    if args.source is not None and args.compare is not None:
        return "give --from or --compare, not both"
    if args.prometheus is not None and args.source is not None:
        return ("--from and --prometheus are two sources; give one (with --prometheus, "
                "--compare takes selectors or ranges)")
    if not (0 < args.duration < math.inf) or not (0 < args.interval < math.inf):
        return "--duration and --interval must be positive numbers of seconds"
    if args.interval > args.duration / 2:
        return (f"--interval {args.interval:g} leaves fewer than two windows in "
                f"--duration {args.duration:g}")
    if not 0 <= args.min_change < 10:
        return "--min-change is a fraction, e.g. 0.1 for 10%"
    return None


def _load_runs(args: argparse.Namespace, client: Any, progress: _Progress) -> list[data.Run]:
    """The one or two runs the command line names, sampled, read or queried (raises _Usage for
    what it cannot read as a source, ``data.RunError`` for a source that fails)."""
    names = list(args.names or ("", ""))
    if args.prometheus is not None:
        try:
            base = scr.normalize_url(args.prometheus, default_path="")
        except ValueError as exc:
            raise _Usage(str(exc)) from None
        specs: list[str | None] = list(args.compare) if args.compare else [None]
        return [_prometheus_source(s, args, client, base, names[i] if args.compare
                                   else (args.title or ""))
                for i, s in enumerate(specs)]
    if args.compare is not None:
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(_load_source, spec, args, client, names[i],
                                   "ab"[i] if args.save else "", progress)
                       for i, spec in enumerate(args.compare)]
            runs = [f.result() for f in futures]
        if any(_is_url(s) for s in args.compare):
            progress.done("sampling done")
        return runs
    runs = [_load_source(args.source, args, client, "", "", progress)]
    if _is_url(args.source):
        progress.done(f"sampled {runs[0].source} for {runs[0].duration_seconds:.0f} s")
    return runs


def run(args: argparse.Namespace) -> int:
    """``specobs report``; see the module docstring."""
    bad = _bad_args(args)
    if bad is not None:
        return _usage(bad)
    try:
        import httpx  # noqa: F401
        import plotly  # noqa: F401
        import prometheus_client  # noqa: F401 - the parser
    except ImportError as exc:
        print(f"{_PROG}: {exc.name or exc} is missing: pip install 'specobs[report]'",
              file=sys.stderr)
        return 1
    try:
        with _client.http_client(args) as client:
            runs = _load_runs(args, client, _Progress())
    except _Usage as exc:
        return _usage(str(exc))
    except data.RunError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 1
    for r in runs:
        if not r.total.cycles > 0:
            print(f"{_PROG}: {r.source}: no speculative decoding cycles in "
                  f"{r.duration_seconds:.0f} s (is the server idle?)", file=sys.stderr)
            return 1
    regressed: list[stats.Change] = []
    changes: list[stats.Change] = []
    if len(runs) == 1:
        text = render_run(runs[0], title=args.title)
    else:
        text = render_compare(runs[0], runs[1], title=args.title, alpha=args.alpha,
                              min_change=args.min_change)
        changes = compare_changes(runs[0], runs[1], alpha=args.alpha,
                                  min_change=args.min_change)
        regressed = stats.regressions(changes)
    try:
        with data.replacing(args.output) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        print(f"{_PROG}: cannot write {args.output}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report_json(runs, args.output, changes, regressed), sort_keys=True,
                         allow_nan=False))
    else:
        print(f"wrote {args.output} ({len(text.encode()) / 1e6:.1f} MB)")
        for line in _summary_lines(runs):
            print("  " + line)
    if regressed:
        a, b = runs
        print(f"{_PROG}: {b.name or 'B'} regressed against {a.name or 'A'}: " + ", ".join(
            f"{c.metric.label} {fmt(c.metric.kind, c.a)} → {fmt(c.metric.kind, c.b)}"
            for c in regressed), file=sys.stderr)
        return REGRESSION_EXIT
    return 0


def _summary_lines(runs: Sequence[data.Run]) -> list[str]:
    """What the terminal shows under ``wrote FILE``: per run its cycles, acceptance and speedup
    (the summary table's figures), one run's findings in a line, and where ``--save`` wrote."""
    from specobs.tools import _breakdown as bd
    from specobs.tools import _diagnosis as dg

    out = []
    for i, r in enumerate(runs):
        b = r.total
        realized = bd.speedups(b)[0]
        name = f"{r.name or 'AB'[i]}: " if len(runs) > 1 else ""
        out.append(
            f"{name}{b.cycles:,.0f} cycles over {r.duration_seconds:.0f} s, acceptance "
            f"{scr.format_percent(b.acceptance_rate)}, "
            + (f"speedup {realized:.2f}x" if realized is not None else "no baseline"))
    if len(runs) == 1:
        out.append("findings " + dg.status_line(run_findings(runs[0])))
    out += [f"snapshots saved to {r.saved_to} (specobs report --from {r.saved_to})"
            for r in runs if r.saved_to is not None]
    return out


def report_json(runs: Sequence[data.Run], output: str, changes: Sequence[stats.Change],
                regressed: Sequence[stats.Change]) -> dict[str, Any]:
    """``report --json``: per run its name, source, duration, windows and whole-run breakdown
    (the fields ``top --json`` prints); one run's findings; a comparison's metrics (key, label,
    A, B, the test's numbers, the verdict) and the keys that regressed. Non-finite numbers are
    null."""
    def clean(value: Any) -> Any:
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple, set, frozenset)):
            return [clean(v) for v in value]
        if value is None or isinstance(value, (bool, int, str)):
            return value
        return str(value)

    result: dict[str, Any] = {
        "output": output,
        "runs": [{"name": r.name, "source": r.source, "duration_seconds": r.duration_seconds,
                  "windows": len(r.windows), "breakdown": r.total.as_json()} for r in runs],
    }
    if len(runs) == 1:
        result["findings"] = [dataclasses.asdict(f) for f in run_findings(runs[0])]
    else:
        result["changes"] = [
            {"key": c.metric.key, "label": c.metric.label, "group": c.metric.group,
             "a": c.a, "b": c.b, "t": c.t, "df": c.df, "noise": c.noise,
             "verdict": c.verdict, "explained_by": list(c.explained_by)}
            for c in changes]
        result["regressions"] = [c.metric.key for c in regressed]
    return clean(result)  # type: ignore[no-any-return]
