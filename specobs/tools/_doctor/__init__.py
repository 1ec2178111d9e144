"""``specobs doctor``: a one-shot health check of a specobs /metrics endpoint.

    specobs doctor http://127.0.0.1:9477/metrics [--wait 2] [--min-cycles N] [--json]
                                                 [--against run.jsonl]
                                                 [--timeout 5] [--max-bytes 16MiB]
    specobs doctor --prometheus http://prometheus:9090 --instance 10.0.0.7:9477
                   [--selector '{job="specobs"}'] [--window 5m] [--history 1h] [--json]

It scrapes the endpoint twice, ``--wait`` seconds apart (the second time asking for OpenMetrics,
which also carries the exemplars; again every 0.5 s while a window without cycles is shorter than
ten of the lifetime's mean cycles, or fewer than ``--min-cycles`` ran), and prints one line per
check of the endpoint with a verdict — OK, INFO (expected here, nothing to change), WARN, FAIL, or
SKIP when a check cannot run — and the reason, then the **findings** of the diagnosis
(:mod:`specobs.tools._diagnosis`, docs/diagnosis.md) on the interval between the scrapes and
against the lifetime before the first: the acceptance profile, where the cycle goes, whether the
host holds the GPU back, a stall, the speedup and its reason, what changed recently. The checks:

=================  ===========================================================================
reachable          the URL answers HTTP 200
specobs endpoint   the body is Prometheus text with a ``specobs_info`` series
contract series    every catalog series is exposed (the missing ones are listed)
cycles advancing   ``specobs_cycles_total`` grew between the two scrapes; no cycle while
                   requests run or wait fails (a stall, as the generated alert pages)
gpu clock          GPU-clock series with a count > 0, or why not (clock=host, CUDA not up)
dropped records    records dropped, by reason, as a fraction of cycles; cycles the engine
                   raised in (``reason="exception"``) are named apart: its failure, not specobs's
exporter errors    hot-path misuse counted by the exporter, by kind
overhead           ``specobs_exporter_overhead_ratio`` against the overhead budget
exporter cpu       the exporter's CPU per cycle between the scrapes (budget 15 µs), its
                   /metrics scrapes left out (doctor's own make most of them) and given per
                   scrape instead; over budget on fewer than 1,000 cycles it is not judged
                   (INFO, with the ``--min-cycles`` that gets a verdict)
exemplars          OpenMetrics exposition carries trace exemplars
baseline           realized speedup: per-sequence tokens/s over the non-speculative baseline,
                   configured or measured by the engine (its ``source`` label), as the
                   recording rules compute it; below 1 fails, with the reason from the data
=================  ===========================================================================

The exit status is 0 when healthy, 1 when a check WARNs or FAILs or a finding is warn or fail
(a problem to act on), and 2 when the endpoint is unusable (unreachable, not a specobs endpoint,
the second scrape failed), the command line is bad, ``--against`` names no saved run or a
package the command needs is not installed.

``--against FILE`` also compares the window with a run saved earlier by ``specobs report
--save`` (the whole run, first sample to last): the ``SPEC-SAVED-*`` findings, acceptance down, a
phase slower, throughput down, each with the size of the change, as ``report --compare`` names a
regression; the ``saved run`` check says which run and how long.

``--json`` prints the same as one JSON object: ``checks``, ``findings`` (code, severity,
sentence, evidence, advice) and ``exit_code``. An endpoint that serves a sample twice (the same
name and labels) fails ``specobs endpoint``: Prometheus rejects such a scrape, and its sums would
be wrong.
Credentials in the URL (``http://user:password@host/``) are sent as HTTP Basic authentication
and never printed.

With ``--prometheus`` the same findings come from a Prometheus server instead: ``increase()``
over ``--window`` for the servers ``--instance`` and ``--selector`` match, against the
``--history`` before the window; the endpoint's checks give way to ``prometheus`` (the query
answered, with the servers matched; exit 2 when not), ``history`` and ``batch sizes``: the
history split into windows as long as ``--window``, whose batch sizes ``SPEC-ADVICE-BATCH`` is
fitted over with the window's. A server without specobs's plugin is read through its engine's
own series (acceptance, its profile, tokens/s), what needs the plugin a ``SKIP`` line saying so;
several servers are each diagnosed on their own, one line per server named by its instance
(:mod:`._prometheus`).

Each request has one deadline, ``--timeout`` seconds for connecting, the headers and the whole
body, and reads at most ``--max-bytes`` of body after decompression (default 16 MiB): an endpoint
that never stops sending, trickles, or sends a gzip bomb fails ``reachable`` with one line
instead of hanging the command (see :mod:`specobs.tools._client`).

The parts: :mod:`._checks` (the endpoint's checks, the report, :func:`examine`),
:mod:`._prometheus` (``--prometheus`` and the cohort); here the command line, ``--against`` a
saved run and the output.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass

from specobs.tools import _client
from specobs.tools import _diagnosis as dg
from specobs.tools import _promapi as pa
from specobs.tools import _scrape as scr
from specobs.tools._doctor._checks import (
    _VERDICT,
    CHECK_NAMES,
    EXEMPLAR_PATTERN,
    MIN_CYCLES_POLL_SECONDS,
    Check,
    Report,
    _fmt_count,
    cost_limit,
    diagnose,
    examine,
    exit_code,
)
from specobs.tools._doctor._prometheus import examine_prometheus

__all__ = [
    "CHECK_NAMES", "EXEMPLAR_PATTERN", "Check", "Report", "SavedRun", "add_arguments",
    "against_saved", "cost_limit", "diagnose", "examine", "examine_prometheus", "exit_code",
    "load_saved_run", "render_text", "run",
]

_PROG = "specobs doctor"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specobs doctor``."""
    _client.add_source_arguments(
        parser, prometheus_help="diagnose from a Prometheus server instead: increase() over "
                                "--window, against the --history before it; servers without "
                                "the plugin through their engine's own series; several "
                                "servers each on its own")
    parser.add_argument("--instance", default=None, metavar="INSTANCE",
                        help="with --prometheus: the server's instance label (host:port)")
    parser.add_argument("--selector", default="",
                        help="with --prometheus: more label matchers, e.g. "
                             "'{job=\"specobs\",model_name=\"llama\"}'")
    parser.add_argument("--window", default="5m",
                        help="with --prometheus: the recent window (default: 5m)")
    parser.add_argument("--history", default="1h",
                        help="with --prometheus: the past before the window it is compared "
                             "with (default: 1h)")
    parser.add_argument("--wait", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between the two scrapes (default: 2)")
    parser.add_argument("--min-cycles", type=float, default=0.0, metavar="N",
                        help="after --wait, keep the window open (scraping again every "
                             f"{MIN_CYCLES_POLL_SECONDS:g} s) until N cycles ran, at most "
                             "--max-wait seconds in all (default: 0, two scrapes)")
    parser.add_argument("--max-wait", type=float, default=60.0, metavar="SECONDS",
                        help="bound of the window with --min-cycles (default: 60)")
    _client.add_limit_arguments(parser)
    parser.add_argument("--against", metavar="FILE", default=None,
                        help="also compare the window with a run saved earlier by "
                             "'specobs report --save FILE' (SPEC-SAVED-* findings)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


@dataclass(frozen=True)
class SavedRun:
    """A run saved earlier by ``specobs report --save``: its name, span and whole-run window."""

    name: str
    seconds: float
    window: dg.Window


def load_saved_run(path: str) -> SavedRun:
    """The whole of the run saved in ``path`` as one window; raises ``ValueError`` with one line
    for the user when the file is not a saved run or holds fewer than two good samples."""
    from specobs.tools.report import _data as rd  # the report's file format, read once

    try:
        source, snapshots = rd.load_snapshots(path)
        run = rd.run_from_scrapes(path, source, snapshots)
    except rd.RunError as exc:
        raise ValueError(str(exc)) from None
    return SavedRun(f"{path}, {source}", run.duration_seconds, dg.window(run.total_delta))


def against_saved(report: Report, saved: SavedRun) -> None:
    """Add to ``report`` the window against the saved run: a ``saved run`` check and the
    ``SPEC-SAVED-*`` findings (none when either side has too few cycles)."""
    if report.recent is None or report.unusable:
        report.checks.append(Check("saved run", "SKIP", "no window to compare"))
        return
    past, recent = saved.window, report.recent
    pair = None
    if past.drafted_first is not None and recent.drafted_first is not None:
        pair = (past.drafted_first, recent.drafted_first)
    found = dg.against_past(recent.breakdown, past.breakdown, pair, dg.saved_run(saved.name))
    data = {"file": saved.name, "seconds": saved.seconds, "cycles": past.breakdown.cycles}
    if not found:
        report.checks.append(Check(
            "saved run", "INFO",
            f"{saved.name}: too few cycles to compare ({_fmt_count(past.breakdown.cycles)} in "
            f"the saved run, {dg.MIN_PAST_CYCLES:.0f} needed; "
            f"{_fmt_count(recent.breakdown.cycles)} in the window, {dg.MIN_RECENT_CYCLES:.0f} "
            "needed)", data))
        return
    report.checks.append(Check(
        "saved run", "OK",
        f"compared with {saved.name}: {_fmt_count(past.breakdown.cycles)} cycles over "
        f"{saved.seconds:.0f} s", data))
    report.findings.extend(found)


def _evidence_text(evidence: dict[str, float | str | None]) -> str:
    parts = []
    for key, value in evidence.items():
        if value is None:
            continue
        if isinstance(value, float):
            text = f"{value:.4g}"
        else:
            text = str(value)
        parts.append(f"{key}={text}")
    return " ".join(parts)


def render_text(report: Report, url: str, code: int) -> str:
    """The report as lines for a terminal: one per check, then each finding with its evidence
    and what to change, then the counts and the exit status."""
    checks = report.checks
    width = max(len(c.name) for c in checks)
    lines = [f"{_PROG} {url}"]
    lines += [f"{c.verdict:<4}  {c.name:<{width}}  {c.reason}" for c in checks]
    if report.findings:
        lines.append("findings:")
        for f in report.findings:
            lines.append(f"{_VERDICT[f.severity]:<4}  {f.code}  {f.sentence}")
            if f.severity in ("warn", "fail") and f.advice:
                lines.append(f"      change: {f.advice}")
            if f.severity in ("warn", "fail") and f.evidence:
                lines.append(f"      evidence: {_evidence_text(f.evidence)}")
    verdicts = [c.verdict for c in checks] + [_VERDICT[f.severity] for f in report.findings]
    counts = {v: verdicts.count(v) for v in ("FAIL", "WARN", "INFO", "OK", "SKIP")}
    meaning = {0: "healthy", 1: "a problem found", 2: "endpoint unusable"}[code]
    lines.append(", ".join(f"{k} {n}" for k, n in counts.items() if n)
                 + f" (exit {code}: {meaning})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``specobs doctor``; see the module docstring."""
    if (args.url is None) == (args.prometheus is None):
        print(f"{_PROG}: give either a specobs /metrics URL or --prometheus URL (exactly one)",
              file=sys.stderr)
        return 2
    prometheus = args.prometheus is not None
    if not prometheus and (args.instance is not None or args.selector):
        print(f"{_PROG}: --instance and --selector only apply with --prometheus",
              file=sys.stderr)
        return 2
    try:
        if prometheus:
            url = scr.normalize_url(args.prometheus, default_path="")
            selector = pa.server_selector(args.selector, args.instance)
            window = pa.parse_window(args.window)
            history = pa.parse_window(args.history)
        else:
            url = scr.normalize_url(args.url)
    except ValueError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 2
    if not args.wait >= 0 or not (0 < args.timeout < math.inf) or not args.min_cycles >= 0 \
            or not (0 < args.max_wait < math.inf):
        print(f"{_PROG}: --wait and --min-cycles must be >= 0, --timeout and --max-wait > 0 "
              "seconds", file=sys.stderr)
        return 2
    try:
        import httpx  # noqa: F401
        import prometheus_client  # noqa: F401 - the parser
    except ImportError as exc:
        print(f"{_PROG}: {exc.name or exc} is missing: pip install 'specobs[cli,prometheus]'",
              file=sys.stderr)
        # Not 1, a problem found: a script must tell a missing dependency from a sick server.
        return 2
    saved: SavedRun | None = None
    if args.against is not None:
        try:
            saved = load_saved_run(args.against)
        except ValueError as exc:
            print(f"{_PROG}: --against: {exc}", file=sys.stderr)
            return 2
    with _client.http_client(args) as client:
        if prometheus:
            report = examine_prometheus(client, url, selector, window, history,
                                        _client.limits_from(args))
        else:
            report = examine(client, url, args.wait, _client.limits_from(args),
                             min_cycles=args.min_cycles, max_wait_seconds=args.max_wait)
    if saved is not None:
        against_saved(report, saved)
    code = exit_code(report)
    # Credentials in the URL went to the server (HTTP Basic), never to the output.
    url = _client.display_url(url)
    if args.json:
        print(json.dumps(
            {"url": url, "ok": code == 0, "exit_code": code,
             "checks": [asdict(c) for c in report.checks],
             "findings": [asdict(f) for f in report.findings]},
            indent=2, sort_keys=True, default=str,
        ))
    else:
        print(render_text(report, url, code))
    sys.stdout.flush()
    return code
