"""``specobs advise``: the speculation length for each band of batch sizes, as the engine's own
configuration, from what a server measured.

    specobs advise http://127.0.0.1:9477/metrics [--engine vllm|sglang|trtllm|table]
                   [--wait 60] [--interval 5] [--max-batch 256] [--json]
    specobs advise --prometheus http://prometheus:9090 --instance 10.0.0.7:9477
                   [--selector '{job="specobs"}'] [--history 6h] [--window 5m] ...

From an endpoint it scrapes every ``--interval`` seconds for ``--wait`` seconds; each interval is
a window, windows of one batch size are joined until they hold enough cycles, and the lifetime
before the first scrape is one more. From Prometheus the ``--history`` is split into windows of
``--window``. Each window's acceptance and costs give the best k at its batch size
(docs/diagnosis.md, "A k for each band of batch sizes"); the bands run from batch 1 up, those
the data does not hold marked as not measured. It prints the bands as a table, the snippet for
``--engine`` (each engine's own syntax, :mod:`specobs.tools._diagnosis._engine_config`), and the
k advice for the current batch. Load that varies over the windows gives bands; a steady load
gives one measured band, which the output says.

The exit status is 0 when a schedule was printed, 1 when the data carries none (too few cycles,
no phase costs), 2 when the source is unusable or the command line is bad.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from typing import Any

from specobs.tools import _client
from specobs.tools import _diagnosis as dg
from specobs.tools import _promapi as pa
from specobs.tools import _scrape as scr
from specobs.tools._diagnosis._engine_config import ENGINES, render

__all__ = ["add_arguments", "advise", "collect_endpoint", "collect_prometheus", "run"]

_PROG = "specobs advise"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specobs advise``."""
    _client.add_source_arguments(
        parser, prometheus_help="read the windows from a Prometheus server instead: the "
                                "--history split into windows of --window")
    parser.add_argument("--instance", default=None, metavar="INSTANCE",
                        help="with --prometheus: the server's instance label (host:port)")
    parser.add_argument("--selector", default="",
                        help="with --prometheus: more label matchers, e.g. '{job=\"specobs\"}'")
    parser.add_argument("--history", default="6h",
                        help="with --prometheus: how far back to read (default: 6h)")
    parser.add_argument("--window", default="5m",
                        help="with --prometheus: the length of each window (default: 5m)")
    parser.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                        help="from an endpoint: seconds to watch it (default: 60)")
    parser.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                        help="from an endpoint: seconds between scrapes (default: 5)")
    parser.add_argument("--engine", choices=ENGINES, default="table",
                        help="the syntax to print the schedule in (default: table)")
    parser.add_argument("--max-batch", type=int, default=256, metavar="N",
                        help="the engine's largest batch (vLLM max_num_seqs; default: 256)")
    _client.add_limit_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _joined_windows(deltas: list[scr.Delta]) -> list[dg.Window]:
    from specobs.tools.report import _data as rd  # the report's joining of short windows

    windows = [rd.Window(0.0, d, dg.window(d).breakdown) for d in deltas]
    return rd.batch_windows(windows)


def collect_endpoint(client: Any, url: str, wait_seconds: float, interval_seconds: float,
                     limits: _client.Limits) -> tuple[list[dg.Window], dg.Window]:
    """The windows of ``url`` over ``wait_seconds`` (one per ``interval_seconds``, joined to
    enough cycles per batch size) and its lifetime before the first scrape; raises
    :class:`~specobs.tools._scrape.ScrapeError` when it cannot be read."""
    from specobs.tools._doctor._checks import _lifetime  # the same lifetime doctor reads

    first = scr.scrape(client, url, limits=limits)
    deltas: list[scr.Delta] = []
    prev, t0 = first, time.monotonic()
    while time.monotonic() - t0 + interval_seconds <= wait_seconds + 1e-9:
        time.sleep(interval_seconds)
        cur = scr.scrape(client, url, limits=limits)
        d = scr.difference(prev, cur)
        if isinstance(d, scr.Delta):
            deltas.append(d)
        prev = cur
    return _joined_windows(deltas), dg.window(_lifetime(first))


def collect_prometheus(client: Any, base_url: str, selector: str, window_seconds: float,
                       history_seconds: float, limits: _client.Limits
                       ) -> tuple[list[dg.Window], dg.Window | None]:
    """The windows of the history (joined to enough cycles per batch size) and the history as
    one window; raises :class:`~specobs.tools.report._data.RunError` or
    :class:`~specobs.tools._scrape.ScrapeError` when Prometheus fails."""
    from specobs.tools.report import _data as rd

    at = time.time()
    start = round(at - history_seconds, 3)
    step = round(min(window_seconds, history_seconds), 3)
    split = rd.prometheus_windows(
        rd.PrometheusRange(client, base_url, selector, start, round(at, 3), step, limits))
    whole = pa.prometheus_delta(client, base_url, selector, history_seconds, limits=limits,
                                at=at)
    return rd.batch_windows(split), dg.window(whole)


def advise(windows: list[dg.Window], whole: dg.Window | None) -> dict[str, Any]:
    """The schedule and the k advice of ``windows`` (and ``whole``, the longest view of the
    server): bands, the choice at each batch observed, the findings."""
    served = [w for w in windows if w.breakdown.cycles >= dg.MIN_SPEEDUP_CYCLES]
    if whole is not None and whole.breakdown.cycles >= dg.MIN_SPEEDUP_CYCLES and not served:
        served = [whole]
    points = [p for w in served if (p := dg.batch_point(w)) is not None]
    threshold = dg.batch_threshold(points)
    at = threshold.evidence.get("extrapolated_batch") if threshold is not None else None
    bands, choices = dg.schedule(served, [dg.model_of([w]) for w in served],
                                 at if isinstance(at, float) else None)
    findings: list[dg.Finding] = []
    found = dg.schedule_finding(bands, choices)
    if found is not None:
        findings.append(found)
    if threshold is not None:
        findings.append(threshold)
    basis = whole if whole is not None and whole.breakdown.cycles >= dg.MIN_SPEEDUP_CYCLES \
        else (served[-1] if served else None)
    if basis is not None:
        k = dg.advise_k(basis.breakdown, dg.model_of([basis]), basis.drafted_first)
        if k is not None:
            findings.append(k)
    return {"bands": bands, "choices": choices, "findings": findings,
            "windows": len(served)}


def _k_in_effect(windows: list[dg.Window]) -> int | None:
    ks = [round(w.breakdown.mean_draft_length) for w in windows
          if w.breakdown.mean_draft_length is not None]
    return max(ks) if ks else None


def run(args: argparse.Namespace) -> int:
    """``specobs advise``; see the module docstring."""
    refused = _refused(args)
    if refused is not None:
        print(f"{_PROG}: {refused}", file=sys.stderr)
        return 2
    from specobs.tools.report import _data as rd

    try:
        if args.prometheus is not None:
            url = scr.normalize_url(args.prometheus, default_path="")
            selector = pa.server_selector(args.selector, args.instance)
            window, history = pa.parse_window(args.window), pa.parse_window(args.history)
        else:
            url = scr.normalize_url(args.url)
    except ValueError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 2
    limits = _client.limits_from(args)
    try:
        with _client.http_client(args) as client:
            if args.prometheus is not None:
                windows, whole = collect_prometheus(client, url, selector, window, history,
                                                    limits)
            else:
                windows, whole = collect_endpoint(client, url, args.wait, args.interval,
                                                  limits)
    except (scr.ScrapeError, rd.RunError) as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 2
    result = advise(windows, whole)
    k_now = _k_in_effect(windows) or (_k_in_effect([whole]) if whole is not None else None)
    snippet = _snippet(result["bands"], args, k_now)
    code = 0 if result["bands"] else 1
    if args.json:
        print(_json(result, _client.display_url(url), args.engine, code, snippet))
    else:
        _print(result, _client.display_url(url), snippet)
    return code


def _refused(args: argparse.Namespace) -> str | None:
    """Why the arguments or the installation cannot run ``advise``; ``None`` where they can."""
    if (args.url is None) == (args.prometheus is None):
        return "give either a specobs /metrics URL or --prometheus URL (exactly one)"
    if not (args.wait > 0 and args.interval > 0 and args.interval <= args.wait) \
            or not args.max_batch >= 1 or not (0 < args.timeout < math.inf):
        return (f"expected --wait >= --interval > 0 seconds, --max-batch >= 1 and "
                f"--timeout > 0; got --wait {args.wait:g}, --interval {args.interval:g}, "
                f"--max-batch {args.max_batch}, --timeout {args.timeout:g}")
    try:
        import httpx  # noqa: F401
        import prometheus_client  # noqa: F401 - the parser
    except ImportError as exc:
        return f"{exc.name or exc} is missing: pip install 'specobs[cli,prometheus]'"
    return None


def _snippet(bands: list[dg.Band], args: argparse.Namespace, k_now: int | None) -> str | None:
    """The schedule in the engine's configuration syntax; ``None`` without bands."""
    if not bands:
        return None
    top = max((b.k for b in bands), default=0)
    try:
        return render(bands, args.engine, max_batch=args.max_batch,
                      num_speculative_tokens=max(top, k_now or 0) or None)
    except ValueError as exc:
        return f"# {args.engine}: {exc}"


def _json(result: dict[str, Any], shown: str, engine: str, code: int,
          snippet: str | None) -> str:
    return json.dumps({
        "source": shown, "engine": engine, "exit_code": code,
        "windows": result["windows"],
        "bands": [asdict(b) for b in result["bands"]],
        "choices": [{"batch": c.batch, "k": c.k,
                     "predicted_tokens_per_second": {str(k): r for k, r in c.rates.items()}}
                    for c in result["choices"]],
        "snippet": snippet,
        "findings": [asdict(f) for f in result["findings"]],
    }, indent=2, sort_keys=True, default=str)


def _print(result: dict[str, Any], shown: str, snippet: str | None) -> None:
    bands = result["bands"]
    print(f"{_PROG} {shown}: {result['windows']} window(s) with enough cycles")
    if not bands:
        print("no schedule: no window held enough cycles with draft and verify timed "
              f"({dg.MIN_SPEEDUP_CYCLES:.0f} needed); watch longer (--wait) or under load")
        return
    measured = [b for b in bands if b.measured]
    if len(result["choices"]) == 1:
        print(f"one batch size observed ({result['choices'][0].batch:.1f}): the other bands "
              "carry its k, not measured; watch the server under varying load for more")
    elif len(measured) < len(bands):
        print("bands marked 'not measured' hold no batch size the data saw")
    for f in result["findings"]:
        print(f"  {f.code}: {f.sentence}")
    print()
    print(snippet)
