"""``specobs report``: one self-contained HTML file of a run, or an A/B comparison of two.

    specobs report --from http://127.0.0.1:9477/metrics --duration 60 -o run.html --save run.jsonl
    specobs report --from run.jsonl -o run.html
    specobs report --prometheus http://prometheus:9090 --selector '{job="specobs"}' --last 30m
    specobs report --compare healthy.jsonl faulty.jsonl -o ab.html
    specobs report --prometheus http://prometheus:9090 --compare '{instance="a:9477"}' \\
        '{instance="b:9477"}' --last 1h

The file opens with no network: plotly.js is inlined once and every chart is a plotly figure.
At the top, a one-screen summary table of the whole run with the definitions of ``specobs top``
and the recording rules (the numbers come from :func:`specobs.tools._breakdown.breakdown` and
:func:`specobs.tools._breakdown.speedups`, nothing is recomputed here), then the findings of
``specobs doctor``'s diagnosis on the whole run and on its last window against the run
(:func:`run_findings`, docs/diagnosis.md). Below: the cycle breakdown
over time on the GPU and host clocks (stacked per phase), phase shares and p50/p99, acceptance
over time and per draft position (from 0, as the engines count), the accept-length distribution
(accepted drafts 0..k), tokens/s per server and per sequence (with the non-speculative
baseline), realized and predicted speedup, drops and exporter health (each on its own axis).
A clock without samples, or any chart without a value, is one line of text, never an empty
chart (docs/report.md, "Charts").

``--compare A B`` puts two runs side by side, with their differences and a verdict per metric;
how a change is judged beyond the run-to-run noise is in :mod:`specobs.tools._report_stats`
and docs/report.md.

Sources are read by :mod:`specobs.tools._report_data`. Errors (an unreachable endpoint, an empty
range, a bad file) are one line on stderr and exit status 1; bad flags exit 2. Credentials in a
URL are sent as HTTP Basic authentication; the report, the ``--save`` file and every message
show the URL without them.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
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

from specobs import catalog
from specobs.tools import _breakdown as bd
from specobs.tools import _diagnosis as dg
from specobs.tools import _http
from specobs.tools import _promapi as pa
from specobs.tools import _report_data as data
from specobs.tools import _report_stats as stats
from specobs.tools import _scrape as scr

__all__ = ["REGRESSION_EXIT", "add_arguments", "compare_changes", "render_compare",
           "render_run", "run"]

#: ``report --compare``'s exit status when B is significantly worse than A (the report is
#: written first); 1 is an error, 2 a usage error, 0 no regression.
REGRESSION_EXIT = 3

_PROG = "specobs report"
_PHASE_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d")
_RUN_COLORS = ("#4c78a8", "#e45756")


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
    _http.add_limit_arguments(parser)


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
        source, snapshots = data.load_snapshots(spec)
        return data.run_from_scrapes(name or os.path.basename(spec), source, snapshots)
    if not _is_url(spec):
        raise data.RunError(f"{spec}: no such file (and not a URL such as "
                            "http://127.0.0.1:9477/metrics)")
    try:
        url = scr.normalize_url(spec)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    snapshots = data.sample_endpoint(
        client, url, args.duration, args.interval, limits=_http.limits_from(args),
        progress=progress.reporter(save_suffix or "run"),
    )
    # The report and the snapshot file are shared: credentials stay out of both.
    shown = _http.display_url(url)
    if args.save:
        data.save_snapshots(_save_path(args.save, save_suffix), shown, snapshots)
    return data.run_from_scrapes(name or shown, shown, snapshots)


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
    return data.prometheus_run(client, base, selector, start, end, step,
                               name=name or spec or "", limits=_http.limits_from(args))


def run(args: argparse.Namespace) -> int:
    """``specobs report``; see the module docstring."""
    if (args.source is None) == (args.compare is None) and args.prometheus is None:
        return _usage("give --from URL|FILE, --compare A B, or --prometheus URL")
    if args.source is not None and args.compare is not None:
        return _usage("give --from or --compare, not both")
    if args.prometheus is not None and args.source is not None:
        return _usage("--from and --prometheus are two sources; give one (with --prometheus, "
                      "--compare takes selectors or ranges)")
    if not (0 < args.duration < math.inf) or not (0 < args.interval < math.inf):
        return _usage("--duration and --interval must be positive numbers of seconds")
    if args.interval > args.duration / 2:
        return _usage(f"--interval {args.interval:g} leaves fewer than two windows in "
                      f"--duration {args.duration:g}")
    if not 0 <= args.min_change < 10:
        return _usage("--min-change is a fraction, e.g. 0.1 for 10%")
    try:
        import httpx  # noqa: F401
        import plotly  # noqa: F401
        import prometheus_client  # noqa: F401 - the parser
    except ImportError as exc:
        print(f"{_PROG}: {exc.name or exc} is missing: pip install 'specobs[report]'",
              file=sys.stderr)
        return 1
    progress = _Progress()
    names = list(args.names or ("", ""))
    try:
        with _http.http_client(args) as client:
            if args.prometheus is not None:
                try:
                    base = scr.normalize_url(args.prometheus, default_path="")
                except ValueError as exc:
                    return _usage(str(exc))
                specs: list[str | None] = list(args.compare) if args.compare else [None]
                runs = [_prometheus_source(s, args, client, base, names[i] if args.compare
                                           else (args.title or ""))
                        for i, s in enumerate(specs)]
            elif args.compare is not None:
                with ThreadPoolExecutor(2) as pool:
                    futures = [pool.submit(_load_source, spec, args, client, names[i],
                                           "ab"[i] if args.save else "", progress)
                               for i, spec in enumerate(args.compare)]
                    runs = [f.result() for f in futures]
                if any(_is_url(s) for s in args.compare):
                    progress.done("sampling done")
            else:
                runs = [_load_source(args.source, args, client, "", "", progress)]
                if _is_url(args.source):
                    progress.done(f"sampled {runs[0].source} for "
                                  f"{runs[0].duration_seconds:.0f} s")
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
        tmp = f"{args.output}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, args.output)
    except OSError as exc:
        print(f"{_PROG}: cannot write {args.output}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report_json(runs, args.output, changes, regressed), sort_keys=True,
                         allow_nan=False))
    else:
        print(f"wrote {args.output} ({len(text.encode()) / 1e6:.1f} MB)")
    if regressed:
        a, b = runs
        print(f"{_PROG}: {b.name or 'B'} regressed against {a.name or 'A'}: " + ", ".join(
            f"{c.metric.label} {_fmt(c.metric.kind, c.a)} → {_fmt(c.metric.kind, c.b)}"
            for c in regressed), file=sys.stderr)
        return REGRESSION_EXIT
    return 0


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


# -- the summary table ----------------------------------------------------------------------------


def _fmt(kind: str, value: float | None) -> str:
    if kind == "seconds":
        return scr.format_seconds(value)
    if kind == "percent":
        return scr.format_percent(value)
    if kind == "rate":
        return scr.format_rate(value)
    if kind == "count":
        return scr.format_rate(value, 0)
    return scr.format_rate(value, 2)


def _cell(key: str, text: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<td data-key="{html.escape(key)}"{c}>{html.escape(text)}</td>'


def summary_rows(b: bd.Breakdown) -> list[tuple[str, str, str]]:
    """``(key, label, text)`` for every number of the summary table (what ``top`` shows)."""
    realized, predicted = bd.speedups(b)
    rows = [
        ("window", "window", f"{b.elapsed_seconds:.1f} s"),
        ("cycles", "cycles", scr.format_rate(b.cycles, 0)),
        ("cycles_per_second", "cycles/s", scr.format_rate(b.cycles_per_second)),
        ("acceptance", "acceptance", scr.format_percent(b.acceptance_rate)),
        ("accept_length", "mean acceptance length (incl. bonus)",
         scr.format_rate(b.mean_acceptance_length, 2)),
        ("accepted_per_draft", "accepted drafts per drafting sequence (excl. bonus)",
         scr.format_rate(b.mean_accept_length, 2)),
        ("positions", "per draft position (from 0)",
         ", ".join(f"{p}: {scr.format_percent(v, 0)}" for p, v in b.position_acceptance)
         or scr.DASH),
        ("tokens_per_second", "emitted tok/s", scr.format_rate(b.emitted_tokens_per_second)),
        ("sequence_tokens_per_second", "tok/s per sequence",
         scr.format_rate(b.sequence_tokens_per_second)),
        ("batch", "mean batch", scr.format_rate(b.mean_batch_size, 2)),
        ("baseline", "baseline tok/s", scr.format_rate(b.baseline_tokens_per_second)),
        ("speedup_realized", "realized speedup",
         f"{realized:.2f}x" if realized is not None else scr.DASH),
        ("speedup_predicted", "predicted speedup (gpu / host)",
         " / ".join(f"{v:.2f}x" if v is not None else scr.DASH
                    for v in (predicted.get("gpu"), predicted.get("host")))),
        ("drops", "drops", scr.format_rate(b.dropped_total, 0) + (
            " (" + ", ".join(f"{k} {v:.0f}" for k, v in sorted(b.drops.items())) + ")"
            if b.drops else "")),
        ("sampling", "GPU sampling", f"1 in {b.sampling_interval:.0f}"
         if b.sampling_interval is not None else scr.DASH),
        ("overhead", "exporter overhead", scr.format_percent(b.overhead_ratio, 2)),
        ("exporter_cpu", "exporter CPU / cycle",
         scr.format_seconds(b.exporter_cpu_seconds_per_cycle)),
    ]
    return rows


def _phase_table(b: bd.Breakdown, prefix: str = "") -> str:
    head = ("<tr><th>clock</th><th>phase</th><th>per cycle</th><th>share</th><th>p50</th>"
            "<th>p99</th></tr>")
    body = []
    for clock in bd.CLOCKS:
        n = b.cycle_counts.get(clock, 0.0)
        if not n > 0:
            body.append(f'<tr class="no-clock" data-clock="{clock}"><td>{clock}</td>'
                        f'<td colspan="5" class="note">{html.escape(_no_clock_text(clock))}'
                        "</td></tr>")
            continue
        for phase in b.phases:
            st = b.stats[(phase, clock)]
            k = f"{prefix}{phase}.{clock}"
            body.append(
                f"<tr><td>{clock}</td><td>{html.escape(phase)}</td>"
                + _cell(f"{k}.mean", scr.format_seconds(st.mean_seconds))
                + _cell(f"{k}.share", scr.format_percent(st.share))
                + _cell(f"{k}.p50", scr.format_seconds(st.p50_seconds))
                + _cell(f"{k}.p99", scr.format_seconds(st.p99_seconds)) + "</tr>"
            )
        p50, p99 = b.cycle_quantiles.get(clock, (None, None))
        k = f"{prefix}cycle.{clock}"
        label = f"cycle ({n:.0f} {'sampled ' if clock == 'gpu' else ''}cycles)"
        body.append(
            f'<tr class="total"><td>{clock}</td><td>{label}</td>'
            + _cell(f"{k}.mean", scr.format_seconds(b.cycle_mean_seconds.get(clock)))
            + "<td></td>" + _cell(f"{k}.p50", scr.format_seconds(p50))
            + _cell(f"{k}.p99", scr.format_seconds(p99)) + "</tr>"
        )
    return f'<table class="phases">{head}{"".join(body)}</table>'


def _summary(b: bd.Breakdown, prefix: str = "") -> str:
    rows = summary_rows(b)
    half = (len(rows) + 1) // 2
    cells = []
    for i in range(half):
        pair = [rows[i]] + ([rows[i + half]] if i + half < len(rows) else [])
        cells.append("<tr>" + "".join(f"<th>{html.escape(label)}</th>" + _cell(prefix + key, text)
                                      for key, label, text in pair) + "</tr>")
    return (f'<div class="summary"><table class="numbers">{"".join(cells)}</table>'
            f"{_phase_table(b, prefix)}</div>")


# -- charts ---------------------------------------------------------------------------------------


def _layout(fig: Any, title: str, y: str, height: int = 320, **kw: Any) -> Any:
    kw.setdefault("margin", {"l": 60, "r": 20, "t": 50, "b": 45})
    kw.setdefault("legend", {"orientation": "h", "y": -0.22})
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"}, template="plotly_white",
        height=height, yaxis_title=y, **kw,
    )
    return fig


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def _xs(r: data.Run) -> list[float]:
    return [round(w.end_seconds, 3) for w in r.windows]


def _breakdown_figure(r: data.Run, clock: str, title: str) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, phase in enumerate(r.total.phases):
        ys = [_ms(w.breakdown.stats[(phase, clock)].mean_seconds)
              if (phase, clock) in w.breakdown.stats else None for w in r.windows]
        fig.add_trace(go.Scatter(x=_xs(r), y=ys, name=phase, stackgroup="one", mode="lines",
                                 line={"color": _PHASE_COLORS[i % len(_PHASE_COLORS)]}))
    return _layout(fig, title, "ms per cycle", xaxis_title="seconds")


def _has_clock(r: data.Run, clock: str) -> bool:
    return r.total.cycle_counts.get(clock, 0.0) > 0


def _no_clock_text(clock: str) -> str:
    if clock == "gpu":
        return ("no GPU-clock samples in this run (no CUDA device, or GPU timing off): "
                "host clock only")
    return f"no {clock}-clock samples in this run"


def _phase_share_figure(runs: Sequence[data.Run]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    phases = runs[0].total.phases
    rows = [(r, clock) for r in runs for clock in bd.CLOCKS if _has_clock(r, clock)]
    ys = [f"{r.name} · {clock}" if len(runs) > 1 else clock for r, clock in rows]
    for i, phase in enumerate(phases):
        xs = []
        for r, clock in rows:
            st = r.total.stats.get((phase, clock))
            xs.append(None if st is None or st.share is None else st.share * 100)
        fig.add_trace(go.Bar(y=ys, x=xs, name=phase, orientation="h",
                             marker_color=_PHASE_COLORS[i % len(_PHASE_COLORS)],
                             text=[f"{x:.0f}%" if x is not None else "" for x in xs],
                             textposition="inside", textangle=0))
    # A share too narrow for its label shows none (hover has it), rather than a rotated one.
    fig.update_layout(uniformtext={"minsize": 11, "mode": "hide"})
    fig.update_yaxes(autorange="reversed")  # the first run on top
    return _layout(fig, "Phase share of cycle time", "", height=230 + 40 * len(ys),
                   barmode="stack", xaxis_title="% of cycle time",
                   legend={"orientation": "h", "y": -0.45})


def _quantile_figure(runs: Sequence[data.Run]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for ri, r in enumerate(runs):
        for clock in bd.CLOCKS:
            if not r.total.cycle_counts.get(clock, 0) > 0:
                continue
            xs = [*r.total.phases, "cycle"]
            p50 = [_ms(r.total.stats[(p, clock)].p50_seconds) for p in r.total.phases]
            p99 = [_ms(r.total.stats[(p, clock)].p99_seconds) for p in r.total.phases]
            c50, c99 = r.total.cycle_quantiles.get(clock, (None, None))
            tag = f"{r.name} · {clock}" if len(runs) > 1 else clock
            fig.add_trace(go.Bar(x=xs, y=[*p50, _ms(c50)], name=f"p50 {tag}",
                                 marker_color=_RUN_COLORS[ri], opacity=0.55))
            fig.add_trace(go.Bar(x=xs, y=[*p99, _ms(c99)], name=f"p99 {tag}",
                                 marker_color=_RUN_COLORS[ri]))
    return _layout(fig, "Phase latency p50 / p99", "ms", barmode="group")


def _line_figure(
    runs: Sequence[data.Run], title: str, y: str, getter: Any, scale: float = 1.0,
    hline: float | None = None,
) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for ri, r in enumerate(runs):
        ys = []
        for w in r.windows:
            v = getter(w.breakdown)
            ys.append(None if v is None else v * scale)
        fig.add_trace(go.Scatter(x=_xs(r), y=ys, name=r.name, mode="lines+markers",
                                 line={"color": _RUN_COLORS[ri % 2]}))
    if hline is not None:
        fig.add_hline(y=hline, line_dash="dot", line_color="#888")
    return _layout(fig, title, y, xaxis_title="seconds")


def _positions_figure(runs: Sequence[data.Run]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for ri, r in enumerate(runs):
        pos = r.total.position_acceptance
        fig.add_trace(go.Bar(x=[f"position {p}" for p, _ in pos],
                             y=[None if v is None else v * 100 for _, v in pos], name=r.name,
                             marker_color=_RUN_COLORS[ri % 2]))
    return _layout(fig, "Acceptance per draft position", "% of drafted accepted",
                   barmode="group", yaxis_range=[0, 100],
                   xaxis_title="draft position (0 = the first drafted token, as the engines "
                               "count)")


def draft_length(b: bd.Breakdown) -> int | None:
    """k, the most draft tokens a sequence proposes per cycle: the draft positions the
    per-position counters name (0..k-1, as vLLM's), ``None`` when they name none."""
    positions = [int(p) for p, _ in b.position_acceptance if p.isdigit()]
    return max(positions) + 1 if positions else None


def accept_length_distribution(
    delta: scr.Delta, k: int | None = None
) -> list[tuple[str, float]]:
    """Drafting sequences per number of accepted draft tokens (0..k, the bonus token
    excluded), from the histogram's bucket deltas, non-cumulative.

    The histogram's buckets are 0..k+1 (``catalog.accept_length_buckets``): the one at k+1
    (and +Inf) can never fill, so with ``k`` known the axis ends at k. A bucket above k that
    did fill (a source with another k) is kept, never hidden."""
    buckets: dict[float, float] = {}
    for le, v in delta.counters.by(catalog.ACCEPT_LENGTH.name + "_bucket", "le").items():
        try:
            buckets[float(le)] = v
        except ValueError:
            continue
    out: list[tuple[str, float]] = []
    prev = 0.0
    for i, bound in enumerate(sorted(buckets)):
        count = max(0.0, buckets[bound] - prev)
        prev = buckets[bound]
        label = f"{bound:g}" if math.isfinite(bound) else "more"
        beyond = bound > k if k is not None else bool(i) and not math.isfinite(bound)
        if beyond and count == 0:
            continue
        out.append((label, count))
    return out


def _accept_length_figure(runs: Sequence[data.Run]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    ks = {draft_length(r.total) for r in runs} - {None}
    for ri, r in enumerate(runs):
        dist = accept_length_distribution(r.total_delta, draft_length(r.total))
        total = math.fsum(v for _, v in dist) or 1.0
        fig.add_trace(go.Bar(x=[k for k, _ in dist], y=[v / total * 100 for _, v in dist],
                             name=r.name, marker_color=_RUN_COLORS[ri % 2]))
    k_text = f", k = {ks.pop()}" if len(ks) == 1 else ""
    fig.update_xaxes(type="category")
    return _layout(fig, "Accept-length distribution", "% of drafting sequence-cycles",
                   barmode="group",
                   xaxis_title=f"accepted draft tokens per sequence-cycle (0..k{k_text}; "
                               "tokens emitted = 1 more, the bonus)")


def _per_server_figure(
    runs: Sequence[data.Run], title: str, y: str, attr: str, baseline: bool = False
) -> Any:
    """One line per run and server of ``Breakdown.attr`` per window; with ``baseline``, the
    non-speculative baseline gauge of each (``specobs_baseline_sequence_tokens_per_second``)
    as a dashed line beside it, or a note where the data holds none."""
    import plotly.graph_objects as go

    fig = go.Figure()
    any_baseline = False
    for ri, r in enumerate(runs):
        for si, server in enumerate(r.servers()):
            per_window = [data.per_server(w.delta, server) for w in r.windows]
            ys = [getattr(b, attr) for b in per_window]
            name = " · ".join(x for x in (r.name if len(runs) > 1 else "", server) if x) \
                or (r.name if not baseline else "speculative")
            fig.add_trace(go.Scatter(x=_xs(r), y=ys, name=name, mode="lines+markers",
                                     line={"color": _RUN_COLORS[ri % 2],
                                           "dash": ("solid", "dash", "dot")[si % 3]}))
            base = [b.baseline_tokens_per_second for b in per_window]
            if baseline and any(v is not None for v in base):
                any_baseline = True
                shown = "" if name == "speculative" else f"{name} · "
                fig.add_trace(go.Scatter(
                    x=_xs(r), y=base, name=f"{shown}non-speculative baseline",
                    mode="lines", opacity=0.8, line={"color": _RUN_COLORS[ri % 2],
                                                     "dash": "longdash", "width": 3}))
    if baseline and not any_baseline:
        fig.add_annotation(text="no non-speculative baseline in this run", showarrow=False,
                           x=0.5, y=0.95, xref="paper", yref="paper", font={"color": "#888"})
    fig.update_yaxes(rangemode="tozero")
    return _layout(fig, title, y, xaxis_title="seconds")


def _speedup_figure(runs: Sequence[data.Run]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for ri, r in enumerate(runs):
        tag = f"{r.name} · " if len(runs) > 1 else ""
        sp = [bd.speedups(w.breakdown) for w in r.windows]
        fig.add_trace(go.Scatter(x=_xs(r), y=[s[0] for s in sp], name=f"{tag}realized",
                                 mode="lines+markers", line={"color": _RUN_COLORS[ri % 2]}))
        for clock, dash in (("gpu", "dash"), ("host", "dot")):
            ys = [s[1].get(clock) for s in sp]
            if any(v is not None for v in ys):
                fig.add_trace(go.Scatter(x=_xs(r), y=ys, name=f"{tag}predicted ({clock})",
                                         mode="lines", line={"color": _RUN_COLORS[ri % 2],
                                                             "dash": dash}))
    if not any(r.total.baseline_tokens_per_second for r in runs):
        fig.add_annotation(text="no baseline configured: realized speedup unknown",
                           showarrow=False, x=0.5, y=0.95, xref="paper", yref="paper",
                           font={"color": "#888"})
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888")
    return _layout(fig, "Speedup: realized vs predicted", "x baseline", xaxis_title="seconds")


def _health_figure(runs: Sequence[data.Run]) -> Any:
    """Drops, the exporter's CPU per cycle and its overhead, each on its own axis: µs and a
    fraction of a percent on one axis flattened the overhead to zero."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07, subplot_titles=(
        "dropped records / s", "exporter CPU per cycle (µs)", "exporter overhead (% of cycle)"))
    for ri, r in enumerate(runs):
        tag = f"{r.name} · " if len(runs) > 1 else ""
        colour = _RUN_COLORS[ri % 2]
        reasons = sorted({k for w in r.windows for k in w.breakdown.drops})
        for reason in [None, *reasons] if len(reasons) > 1 else [None]:
            ys = [(w.breakdown.dropped_total if reason is None else
                   w.breakdown.drops.get(reason, 0.0)) / (w.breakdown.elapsed_seconds or 1)
                  for w in r.windows]
            name = "dropped (all reasons)" if reason is None else f"dropped: {reason}"
            fig.add_trace(go.Scatter(x=_xs(r), y=ys, name=tag + name, mode="lines",
                                     line={"color": colour,
                                           "dash": "solid" if reason is None else "dot"}),
                          row=1, col=1)
        fig.add_trace(go.Scatter(
            x=_xs(r), y=[None if w.breakdown.exporter_cpu_seconds_per_cycle is None else
                         w.breakdown.exporter_cpu_seconds_per_cycle * 1e6 for w in r.windows],
            name=f"{tag}CPU µs/cycle", mode="lines", line={"color": colour}), row=1, col=2)
        fig.add_trace(go.Scatter(
            x=_xs(r), y=[None if w.breakdown.overhead_ratio is None else
                         w.breakdown.overhead_ratio * 100 for w in r.windows],
            name=f"{tag}overhead %", mode="lines", line={"color": colour, "dash": "dot"}),
            row=1, col=3)
    fig.update_yaxes(rangemode="tozero")
    fig.update_annotations(font_size=12)
    return _layout(fig, "Drops and exporter health", "", margin={"l": 60, "r": 20, "t": 80,
                                                                  "b": 45})


def _figures(runs: Sequence[data.Run]) -> list[tuple[str, str, Any]]:
    """``(id, section, figure)`` in page order."""
    figs: list[tuple[str, str, Any]] = []
    for ri, r in enumerate(runs):
        for clock in bd.CLOCKS:
            # A clock without samples gets a line (section_notes), not an empty chart.
            if not _has_clock(r, clock):
                continue
            tag = f" — {r.name}" if len(runs) > 1 else ""
            figs.append((f"breakdown-{clock}-{ri}", "Cycle breakdown",
                         _breakdown_figure(r, clock, f"Cycle breakdown, {clock} clock{tag}")))
    figs += [
        ("phase-share", "Phases", _phase_share_figure(runs)),
        ("phase-quantiles", "Phases", _quantile_figure(runs)),
        ("acceptance", "Acceptance", _line_figure(
            runs, "Acceptance rate over time", "% of drafted tokens accepted",
            lambda b: b.acceptance_rate, 100.0)),
        ("positions", "Acceptance", _positions_figure(runs)),
        ("accept-length", "Acceptance", _accept_length_figure(runs)),
        ("tokens-server", "Throughput", _per_server_figure(
            runs, "Emitted tokens/s per server", "tokens/s", "emitted_tokens_per_second")),
        ("tokens-sequence", "Throughput", _per_server_figure(
            runs, "Tokens/s per sequence", "tokens/s", "sequence_tokens_per_second",
            baseline=True)),
        ("speedup", "Throughput", _speedup_figure(runs)),
        ("health", "Health", _health_figure(runs)),
    ]
    return figs


def section_notes(runs: Sequence[data.Run]) -> dict[str, str]:
    """Section → one line of HTML under its heading: the clocks a run has no samples of."""
    lines = []
    for clock in bd.CLOCKS:
        missing = [ri for ri, r in enumerate(runs) if not _has_clock(r, clock)]
        if len(runs) > 1 and len(missing) == len(runs):
            text = _no_clock_text(clock).replace("in this run", "in either run")
            lines.append(f'<p class="note" data-no-clock="{clock}-all">'
                         f"{html.escape(text)}.</p>")
            continue
        for ri in missing:
            who = f"{html.escape(runs[ri].name)}: " if len(runs) > 1 else ""
            lines.append(f'<p class="note" data-no-clock="{clock}-{ri}">{who}'
                         f"{html.escape(_no_clock_text(clock))}.</p>")
    return {"Cycle breakdown": "".join(lines)} if lines else {}


# -- the page -------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;
max-width:1400px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 6px;border-bottom:1px solid
#ddd;padding-bottom:3px}.meta{color:#666;font-size:13px;margin-bottom:12px}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 9px;text-align:right;
border-bottom:1px solid #eee}th{text-align:left;font-weight:600;color:#444}
.summary{display:flex;gap:28px;flex-wrap:wrap;align-items:flex-start}
tr.total td{font-weight:600}.grid{display:grid;grid-template-columns:1fr 1fr;gap:8px}
.chart{min-height:300px;border:1px solid #f0f0f0}.chart.wide{grid-column:1/-1}
.note{color:#666;font-size:13px}
.significant{background:#fde2e1;font-weight:600}.consequence{background:#fff4d6}
.findings{padding:8px 12px;border-left:4px solid #e45756;background:#fff8f7;margin:10px 0}
table.diagnosis td{text-align:left;vertical-align:top}.sev-fail{background:#fde2e1}
.sev-warn{background:#fff4d6}
.findings.none{border-color:#54a24b;background:#f4fbf3}
td.verdict{text-align:left}table.compare td{white-space:nowrap}
table.compare td.verdict,table.compare td.note{white-space:normal}td.note{text-align:left}
"""


def _draws_something(fig: Any) -> bool:
    """Whether any trace of ``fig`` has a finite value to draw (x of a horizontal bar, else
    y): an empty chart is a line of text instead."""
    for t in fig.data:
        values = t.x if getattr(t, "orientation", None) == "h" else t.y
        if any(isinstance(v, (int, float)) and math.isfinite(v) for v in values or ()):
            return True
    return False


def _page(title: str, meta: str, body: str, figs: list[tuple[str, str, Any]],
          notes: dict[str, str] | None = None) -> str:
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    notes = notes or {}
    order = list(dict.fromkeys(section for _, section, _ in figs))
    sections: list[str] = []
    for section in order:
        sections.append(f"<h2>{html.escape(section)}</h2>{notes.get(section, '')}"
                        '<div class="grid">')
        members = [(fid, fig) for fid, s, fig in figs if s == section]
        for fid, fig in members:
            if not _draws_something(fig):
                sections.insert(-1, f'<p class="note" data-empty="{fid}">'
                                f"{html.escape(fig.layout.title.text or fid)}: no data in "
                                "this run.</p>")
        members = [(fid, fig) for fid, fig in members if _draws_something(fig)]
        for i, (fid, fig) in enumerate(members):
            div = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=fid,
                              config={"displaylogo": False, "responsive": True,
                                      "displayModeBar": False})
            title_text = fig.layout.title.text or ""
            # A chart alone in its row of two takes the whole row.
            wide = " wide" if i == len(members) - 1 and len(members) % 2 else ""
            sections.append(f'<div class="chart{wide}" data-title="{html.escape(title_text)}">'
                            f"{div}</div>")
        sections.append("</div>")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>"
        f"<h1>{html.escape(title)}</h1><div class=\"meta\">{meta}</div>{body}"
        + "".join(sections)
        + "</body></html>\n"
    )


def _meta(r: data.Run) -> str:
    info = r.total.info
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r.start_unix))
    parts = [
        f"<b>{html.escape(r.name)}</b>: {html.escape(r.source)}",
        f"{when}, {r.duration_seconds:.0f} s, {len(r.windows)} windows",
    ]
    if info:
        parts.append(html.escape(", ".join(
            f"{k}={v}" for k, v in sorted(info.items()) if k not in ("instance", "job"))))
    if r.failures:
        parts.append(f'<span class="significant">{len(r.failures)} failed samples '
                     f"(first: {html.escape(r.failures[0][1][:120])})</span>")
    return " · ".join(parts)


def run_findings(r: data.Run) -> list[dg.Finding]:
    """The diagnosis of a run (docs/diagnosis.md): the whole run's findings, then its last
    window against the whole run when the run has at least four windows."""
    whole = dg.window(r.total_delta, r.end_unix)
    findings = dg.diagnose(whole)
    if len(r.windows) >= 4 and r.total.cycles > 0:
        findings += dg.against_past(r.windows[-1].breakdown, r.total)
    return findings


def findings_section(findings: Sequence[dg.Finding]) -> str:
    """The report's findings: one row per finding, the worst first, with what to change."""
    order = sorted(findings, key=lambda f: -dg.SEVERITIES.index(f.severity))
    rows = "".join(
        f'<tr class="sev-{f.severity}" data-code="{html.escape(f.code)}">'
        f"<td>{html.escape(f.severity.upper())}</td><td><code>{html.escape(f.code)}</code></td>"
        f"<td>{html.escape(f.sentence)}</td><td>{html.escape(f.advice)}</td></tr>"
        for f in order
    )
    return (f'<h2>Findings ({html.escape(dg.status_line(findings))})</h2>'
            '<p class="note">The diagnosis of <code>specobs doctor</code> on the whole run, and '
            "its last window against the run (docs/diagnosis.md).</p>"
            '<table class="diagnosis"><tr><th>severity</th><th>code</th><th>finding</th>'
            f"<th>what to look at</th></tr>{rows}</table>")


def render_run(r: data.Run, title: str | None = None) -> str:
    """The HTML report of one run."""
    body = ("<h2>Summary (whole run, as <code>specobs top</code> computes it)</h2>"
            + _summary(r.total) + findings_section(run_findings(r)))
    if r.up:
        down = {k: sum(1 for _, v in pts if v < 1) for k, pts in r.up.items()}
        body += ('<p class="note">scrape health (Prometheus <code>up</code>): '
                 + html.escape(", ".join(f"{k or 'target'}: {n} failed of {len(r.up[k])}"
                                         for k, n in sorted(down.items()))) + "</p>")
    if r.scrape_seconds:
        worst = max(s for _, s in r.scrape_seconds)
        body += (f'<p class="note">scrapes: {len(r.scrape_seconds)} ok, {len(r.failures)} '
                 f"failed, slowest {scr.format_seconds(worst)}</p>")
    return _page(title or f"specobs report — {r.name}", _meta(r), body, _figures([r]),
                 section_notes([r]))


def _compare_table(changes: Sequence[stats.Change], name_a: str, name_b: str) -> str:
    head = (f"<tr><th>metric</th><th>{html.escape(name_a)}</th><th>{html.escape(name_b)}</th>"
            "<th>difference</th><th>relative</th><th>noise (±1 SE)</th><th>windows</th>"
            "<th>verdict</th></tr>")
    rows = []
    group = ""
    # A metric neither run has (the gpu clock of CPU runs) is left out, and named once below.
    absent = [c for c in changes if c.a is None and c.b is None]
    for c in changes:
        if c in absent:
            continue
        m = c.metric
        if m.group != group:
            group = m.group
            rows.append(f'<tr><th colspan="8">{html.escape(group)}</th></tr>')
        diff = c.difference
        if m.kind == "percent":
            d_text = "—" if diff is None else f"{diff * 100:+.1f} pp"
            noise = "—" if c.noise is None else f"{c.noise * 100:.1f} pp"
        else:
            d_text = "—" if diff is None else ("+" if diff >= 0 else "-") + _fmt(m.kind, abs(diff))
            noise = "—" if c.noise is None else _fmt(m.kind, c.noise)
        rel = c.relative
        verdict = c.verdict + (f" of {', '.join(c.explained_by)}" if c.explained_by else "")
        if c.t is not None and c.verdict != "n/a":
            verdict += f" (t={c.t:+.1f})" if math.isfinite(c.t) else " (t=±inf)"
        cls = {"significant": "significant", "consequence": "consequence",
               "load differs": "consequence"}.get(c.verdict, "")
        rows.append(
            f'<tr class="{cls}" data-metric="{m.key}" data-verdict="{c.verdict}">'
            f"<th>{html.escape(m.label)}</th>"
            + _cell(f"a.{m.key}", _fmt(m.kind, c.a)) + _cell(f"b.{m.key}", _fmt(m.kind, c.b))
            + _cell(f"diff.{m.key}", d_text)
            + _cell(f"rel.{m.key}", "—" if rel is None else f"{rel * 100:+.1f}%")
            + _cell(f"noise.{m.key}", noise)
            + f"<td>{c.windows_a} / {c.windows_b}</td>"
            + f'<td class="verdict">{html.escape(verdict)}</td></tr>'
        )
    if absent:
        gpu = [c for c in absent if "gpu" in c.metric.key]
        text = ("no GPU-clock samples in either run (no CUDA device, or GPU timing off): "
                "its rows are left out" if len(gpu) == len(absent) else
                "in neither run: " + ", ".join(c.metric.label for c in absent))
        rows.append(f'<tr class="no-data"><td colspan="8" class="note">{html.escape(text)}'
                    "</td></tr>")
    return f'<table class="compare">{head}{"".join(rows)}</table>'


def compare_changes(a: data.Run, b: data.Run, *, alpha: float = 0.01,
                    min_change: float = 0.10) -> list[stats.Change]:
    """Every compared metric of runs ``a`` and ``b`` with its verdict."""
    positions = [p for p, _ in a.total.position_acceptance]
    positions += [p for p, _ in b.total.position_acceptance if p not in positions]
    phases = list(a.total.phases) + [p for p in b.total.phases if p not in a.total.phases]
    return stats.compare(
        stats.metric_defs(phases, positions), a.total, b.total,
        [w.breakdown for w in a.windows], [w.breakdown for w in b.windows],
        alpha=alpha, min_change=min_change,
    )


def render_compare(
    a: data.Run, b: data.Run, *, title: str | None = None, alpha: float = 0.01,
    min_change: float = 0.10,
) -> str:
    """The HTML report comparing runs ``a`` and ``b``."""
    if a.name == b.name:
        a.name, b.name = f"A: {a.name}", f"B: {b.name}"
    changes = compare_changes(a, b, alpha=alpha, min_change=min_change)
    found = stats.findings(changes)
    consequences = [c for c in changes if c.verdict == "consequence"]
    load = [c for c in changes if c.verdict == "load differs"]
    caveat = ("<p>The load differed (" + html.escape(", ".join(
        f"{c.metric.label} {_fmt(c.metric.kind, c.a)} → {_fmt(c.metric.kind, c.b)}"
        for c in load)) + "): timing and throughput compare unlike traffic.</p>") if load else ""
    if found:
        items = "".join(
            f"<li data-finding=\"{c.metric.key}\"><b>{html.escape(c.metric.label)}</b>: "
            f"{_fmt(c.metric.kind, c.a)} → {_fmt(c.metric.kind, c.b)}</li>" for c in found)
        extra = ("<p>Following from them: " + html.escape(", ".join(
            c.metric.label for c in consequences)) + ".</p>") if consequences else ""
        box = (f'<div class="findings"><b>Changes beyond run-to-run noise</b> (Welch t-test '
               f"over windows at alpha {alpha:g} and at least {min_change:.0%} change)"
               f"<ul>{items}</ul>{extra}{caveat}</div>")
    else:
        box = ('<div class="findings none"><b>No change beyond run-to-run noise</b> '
               f"(Welch t-test over windows at alpha {alpha:g} and at least "
               f"{min_change:.0%} change){caveat}</div>")
    body = (box + "<h2>Side by side (whole runs)</h2>"
            + _compare_table(changes, a.name, b.name)
            + f"<h2>Summary of {html.escape(a.name)}</h2>" + _summary(a.total, "a.")
            + f"<h2>Summary of {html.escape(b.name)}</h2>" + _summary(b.total, "b."))
    meta = _meta(a) + "<br>" + _meta(b)
    return _page(title or f"specobs report — {a.name} vs {b.name}", meta, body,
                 _figures([a, b]), section_notes([a, b]))
