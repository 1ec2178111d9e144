"""``specobs doctor``: a one-shot health check of a specobs /metrics endpoint.

    specobs doctor http://127.0.0.1:9477/metrics [--wait 2] [--json] [--timeout 5]
                                                 [--max-bytes 16MiB]

It scrapes the endpoint twice, ``--wait`` seconds apart (the second time asking for OpenMetrics,
which also carries the exemplars), and prints one line per check with a verdict — OK, WARN, FAIL,
or SKIP when a check cannot run — and the reason:

=================  ===========================================================================
reachable          the URL answers HTTP 200
specobs endpoint   the body is Prometheus text with a ``specobs_info`` series
contract series    every catalog series is exposed (the missing ones are listed)
cycles advancing   ``specobs_cycles_total`` grew between the two scrapes
gpu clock          GPU-clock series with a count > 0, or why not (clock=host, CUDA not up)
dropped records    records dropped, by reason, as a fraction of cycles
exporter errors    hot-path misuse counted by the exporter, by kind
overhead           ``specobs_exporter_overhead_ratio`` against the overhead budget
exporter cpu       the exporter's CPU seconds per cycle between the scrapes (budget 15 µs)
exemplars          OpenMetrics exposition carries trace exemplars
baseline           realized speedup: per-sequence tokens/s over the non-speculative baseline,
                   configured or measured by the engine (its ``source`` label), as the
                   recording rules compute it; below 1 fails
=================  ===========================================================================

The exit status is 1 when any check FAILs, else 0 (2 for a bad command line). ``--json`` prints
the same as one JSON object. An endpoint that serves a sample twice (the same name and labels)
fails ``specobs endpoint``: Prometheus rejects such a scrape, and its sums would be wrong.
Credentials in the URL (``http://user:password@host/``) are sent as HTTP Basic authentication
and never printed.

Each request has one deadline, ``--timeout`` seconds for connecting, the headers and the whole
body, and reads at most ``--max-bytes`` of body after decompression (default 16 MiB): an endpoint
that never stops sending, trickles, or sends a gzip bomb fails ``reachable`` with one line
instead of hanging the command (see :mod:`specobs.tools._http`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from specobs import catalog
from specobs.tools import _breakdown as bd
from specobs.tools import _http
from specobs.tools import _scrape as scr

__all__ = ["Check", "add_arguments", "diagnose", "run"]

_PROG = "specobs doctor"

#: The exporter's overhead budget when ``specobs_info`` does not say (``sampling="every_N"``).
DEFAULT_OVERHEAD_BUDGET = 0.005
#: DESIGN.md: everything specobs does on the worker's CPU, per cycle, at 1,000 cycles/s.
CPU_BUDGET_SECONDS_PER_CYCLE = 15e-6
#: Dropped records above this fraction of cycles fail the check (below it: a warning).
DROP_FAIL_FRACTION = 0.10
#: Series an endpoint may legitimately leave out: gauges that exist only once configured or fed.
OPTIONAL_METRICS: tuple[catalog.Metric, ...] = (
    catalog.BASELINE_SEQUENCE_TOKENS,
    catalog.REQUESTS_RUNNING,
    catalog.REQUESTS_WAITING,
    catalog.LAST_CYCLE_TIMESTAMP,
)
#: An exemplar carrying a trace id. prometheus_client sorts exemplar labels, so span_id comes
#: first: ``... 5.0 # {span_id="…",trace_id="…"} 0.0002 1795981246.98``.
EXEMPLAR_PATTERN = re.compile(r' # \{[^}]*\btrace_id="')

CHECK_NAMES: tuple[str, ...] = (
    "reachable",
    "specobs endpoint",
    "contract series",
    "cycles advancing",
    "gpu clock",
    "dropped records",
    "exporter errors",
    "overhead",
    "exporter cpu",
    "exemplars",
    "baseline",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specobs doctor``."""
    parser.add_argument("url", help="a specobs /metrics URL, e.g. http://127.0.0.1:9477/metrics "
                                    "(host:port means http://host:port/metrics)")
    parser.add_argument("--wait", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between the two scrapes (default: 2)")
    _http.add_limit_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


@dataclass
class Check:
    """One line of the report."""

    name: str
    verdict: str  # OK | WARN | FAIL | SKIP
    reason: str
    data: dict[str, Any] = field(default_factory=dict)


def _skip_rest(checks: list[Check], reason: str) -> list[Check]:
    done = {c.name for c in checks}
    return checks + [Check(n, "SKIP", reason) for n in CHECK_NAMES if n not in done]


def _fmt_count(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"


def _budget(info: dict[str, str]) -> float:
    sampling = info.get("sampling", "")
    if sampling.startswith("adaptive_"):
        try:
            value = float(sampling.removeprefix("adaptive_"))
        except ValueError:
            return DEFAULT_OVERHEAD_BUDGET
        if value > 0 and math.isfinite(value):
            return value
    return DEFAULT_OVERHEAD_BUDGET


def diagnose(
    client: Any, url: str, wait_seconds: float, limits: _http.Limits = _http.DEFAULT_LIMITS
) -> list[Check]:
    """Run every check against ``url``; see the module docstring. Two requests in all."""
    checks: list[Check] = []

    # reachable / specobs endpoint
    t0 = time.monotonic()
    try:
        text, content_type = scr.fetch_text(client, url, limits=limits)
    except scr.ScrapeError as exc:
        checks.append(Check("reachable", "FAIL", str(exc)))
        return _skip_rest(checks, "needs a reachable endpoint")
    ms = (time.monotonic() - t0) * 1e3
    checks.append(Check(
        "reachable", "OK", f"HTTP 200 in {ms:.0f} ms, {len(text.encode()) / 1024:.1f} KiB",
        {"milliseconds": ms, "bytes": len(text.encode()), "content_type": content_type},
    ))
    try:
        series = scr.parse_exposition(text)
    except scr.ScrapeError as exc:
        checks.append(Check("specobs endpoint", "FAIL", f"{_http.display_url(url)}: {exc}"))
        return _skip_rest(checks, "needs a specobs endpoint")
    first = scr.Scrape(series, t0, text)
    if not first.is_specobs:
        checks.append(Check("specobs endpoint", "FAIL", scr.not_specobs_message(url, series)))
        return _skip_rest(checks, "needs a specobs endpoint")
    info = first.info
    checks.append(Check(
        "specobs endpoint", "OK",
        f"specobs {info.get('version', '?')}, phases {info.get('phases', '?')}, "
        f"gpu_clock={info.get('gpu_clock', '?')}, sampling {info.get('sampling', '?')}",
        {"info": info},
    ))

    # contract series
    names = series.names()
    required = [m for m in catalog.CATALOG if m not in OPTIONAL_METRICS]
    missing = [s for m in required for s in m.series() if s not in names]
    absent_optional = [m.name for m in OPTIONAL_METRICS if not any(
        s in names for s in m.series()
    )]
    if missing:
        checks.append(Check(
            "contract series", "FAIL",
            f"{len(missing)} catalog series missing: {', '.join(missing)}",
            {"missing": missing, "absent_optional": absent_optional},
        ))
    else:
        note = f" (not set: {', '.join(absent_optional)})" if absent_optional else ""
        checks.append(Check(
            "contract series", "OK", f"all {len(required)} contract metrics present{note}",
            {"missing": [], "absent_optional": absent_optional},
        ))

    # second scrape, cycles advancing; as OpenMetrics, so it also shows the exemplars
    time.sleep(max(0.0, wait_seconds))
    try:
        second = scr.scrape(client, url, openmetrics=True, limits=limits)
    except scr.ScrapeError as exc:
        checks.append(Check("cycles advancing", "FAIL", f"second scrape failed: {exc}"))
        return _skip_rest(checks, "needs two scrapes")
    delta = scr.difference(first, second)
    b: bd.Breakdown | None = None
    if isinstance(delta, scr.CounterReset):
        checks.append(Check("cycles advancing", "WARN", f"{delta} between the two scrapes"))
    else:
        b = bd.breakdown(delta)
        elapsed = delta.elapsed_seconds
        if b.cycles > 0:
            checks.append(Check(
                "cycles advancing", "OK",
                f"{_fmt_count(b.cycles)} cycles in {elapsed:.1f} s "
                f"({scr.format_rate(b.cycles_per_second)}/s)",
                {"cycles": b.cycles, "seconds": elapsed},
            ))
        else:
            last = second.series.total(catalog.LAST_CYCLE_TIMESTAMP.name)
            ago = f"; last cycle {time.time() - last:.0f} s ago" if last else "; no cycle yet"
            checks.append(Check(
                "cycles advancing", "WARN",
                f"no cycles in {elapsed:.1f} s: the engine is idle or stalled{ago}",
                {"cycles": 0.0, "seconds": elapsed},
            ))

    s2 = second.series
    info = second.info or info
    cycles_total = s2.total(catalog.CYCLES.name) or 0.0
    checks.append(_gpu_clock(s2, info, cycles_total))
    checks.append(_drops(s2, cycles_total))
    checks.append(_errors(s2))
    checks.append(_overhead(s2, info))
    checks.append(_cpu(b))
    checks.append(_exemplars(second))
    checks.append(_baseline(b, s2))
    return checks


def _gpu_clock(s: scr.Series, info: dict[str, str], cycles_total: float) -> Check:
    gpu_n = s.total(catalog.CYCLE_DURATION.name + "_count", clock="gpu") or 0.0
    sampled = s.total(catalog.SAMPLED_CYCLES.name) or 0.0
    interval = s.total(catalog.SAMPLING_INTERVAL.name)
    clock = info.get("gpu_clock", "?")
    data = {"gpu_cycles": gpu_n, "sampled_cycles": sampled, "gpu_clock": clock}
    if gpu_n > 0:
        every = f", sampling 1 in {interval:.0f}" if interval else ""
        return Check("gpu clock", "OK",
                     f"{_fmt_count(gpu_n)} cycles timed on the GPU clock ({clock}{every})", data)
    if cycles_total <= 0:
        return Check("gpu clock", "WARN", "no cycles yet: cannot tell whether the GPU clock "
                                          "works", data)
    if sampled <= 0 and clock in ("none", "auto"):
        why = (
            "configured with clock=host (gpu_clock=\"none\")" if clock == "none"
            else "clock=auto and the engine has not initialised CUDA (gpu_clock=\"auto\")"
        )
        return Check("gpu clock", "WARN",
                     f"host clock only: CUDA not initialised or clock=host; {why}", data)
    return Check(
        "gpu clock", "WARN",
        f"{_fmt_count(sampled)} cycles sampled but none resolved on the GPU clock "
        f"(gpu_clock={clock}): events still pending, or every sampled cycle was dropped", data,
    )


def _drops(s: scr.Series, cycles_total: float) -> Check:
    by_reason = {k: v for k, v in s.by(catalog.DROPPED_RECORDS.name, "reason").items() if v > 0}
    total = math.fsum(by_reason.values())
    data = {"by_reason": by_reason, "cycles": cycles_total}
    if total <= 0:
        return Check("dropped records", "OK", "none dropped", data)
    fraction = bd.ratio(total, cycles_total)
    parts = ", ".join(f"{k} {_fmt_count(v)}" for k, v in sorted(by_reason.items()))
    frac_text = (
        f"{scr.format_percent(fraction, 2)} of {_fmt_count(cycles_total)} cycles"
        if fraction is not None else "no cycles counted"
    )
    verdict = "FAIL" if fraction is None or fraction > DROP_FAIL_FRACTION else "WARN"
    data["fraction"] = fraction
    return Check("dropped records", verdict, f"{_fmt_count(total)} dropped ({parts}), {frac_text}",
                 data)


def _errors(s: scr.Series) -> Check:
    by_kind = {k: v for k, v in s.by(catalog.ERRORS.name, "kind").items() if v > 0}
    if not by_kind:
        return Check("exporter errors", "OK", "no hot-path misuse or internal errors", {})
    parts = ", ".join(f"{k} {_fmt_count(v)}" for k, v in sorted(by_kind.items()))
    return Check("exporter errors", "WARN",
                 f"{parts} (the engine calls the hot path out of order; see the logs)",
                 {"by_kind": by_kind})


def _overhead(s: scr.Series, info: dict[str, str]) -> Check:
    budget = _budget(info)
    values = [v for (n, _), v in s.samples.items() if n == catalog.OVERHEAD_RATIO.name]
    if not values:
        return Check("overhead", "SKIP", f"no {catalog.OVERHEAD_RATIO.name} series")
    ratio = max(values)
    data = {"overhead_ratio": ratio, "budget": budget}
    text = f"{scr.format_percent(ratio, 2)} of cycle time vs budget {scr.format_percent(budget, 2)}"
    if ratio <= budget:
        return Check("overhead", "OK", text, data)
    sampling = info.get("sampling", "")
    hint = (
        f"; sampling is fixed ({sampling}): leave SPECOBS_SAMPLE_EVERY unset for the adaptive "
        "sampler" if sampling.startswith("every_") else "; the adaptive sampler is catching up"
    )
    return Check("overhead", "WARN", f"{text}, over budget{hint}", data)


def _cpu(b: bd.Breakdown | None) -> Check:
    if b is None or b.exporter_cpu_seconds_per_cycle is None:
        return Check("exporter cpu", "SKIP", "no cycles between the two scrapes")
    per = b.exporter_cpu_seconds_per_cycle
    data = {"seconds_per_cycle": per, "budget_seconds_per_cycle": CPU_BUDGET_SECONDS_PER_CYCLE}
    text = (
        f"{per * 1e6:.1f} µs CPU per cycle between the scrapes "
        f"(budget {CPU_BUDGET_SECONDS_PER_CYCLE * 1e6:.0f} µs)"
    )
    if per <= CPU_BUDGET_SECONDS_PER_CYCLE:
        return Check("exporter cpu", "OK", text, data)
    return Check("exporter cpu", "WARN", f"{text}, over budget (few cycles make this noisy)",
                 data)


def _exemplars(second: scr.Scrape) -> Check:
    text, content_type = second.body, second.content_type
    if "openmetrics" not in content_type:
        return Check("exemplars", "WARN",
                     f"the endpoint ignores Accept: application/openmetrics-text (answered "
                     f"{content_type or 'no content type'}), so it cannot carry exemplars")
    n = len(EXEMPLAR_PATTERN.findall(text))
    if n:
        return Check("exemplars", "OK", f"{n} trace exemplars in the OpenMetrics exposition",
                     {"exemplars": n})
    return Check("exemplars", "WARN",
                 "no trace exemplars in OpenMetrics: tracing may be off (no trace sink, or "
                 "SPECOBS_TRACE_HEAD_RATE=0) or no cycle was traced yet", {"exemplars": 0})


def _baseline(b: bd.Breakdown | None, s: scr.Series) -> Check:
    baseline = s.total(catalog.BASELINE_SEQUENCE_TOKENS.name)
    if baseline is None:
        return Check("baseline", "SKIP",
                     "no baseline configured (configure(baseline_tokens_per_second=...) or "
                     "SPECOBS_BASELINE_TOKENS_PER_SECOND) and none measured by the engine")
    labels = s.labels(catalog.BASELINE_SEQUENCE_TOKENS.name)
    # The recording rules call a baseline without a source label "configured".
    source = (labels[0].get("source") if labels else None) or catalog.BASELINE_SOURCE_CONFIGURED
    if b is None or b.sequence_tokens_per_second is None:
        return Check("baseline", "SKIP",
                     "no cycles with tokens between the two scrapes: cannot measure "
                     f"(baseline {scr.format_rate(baseline)} tok/s, {source})",
                     {"baseline": baseline, "source": source})
    realized = b.sequence_tokens_per_second
    speedup, _ = bd.speedups(b)
    batch = b.mean_batch_size
    data = {"realized": realized, "baseline": baseline, "speedup": speedup, "source": source,
            "mean_batch_size": batch}
    text = (
        f"{scr.format_rate(realized)} tok/s per sequence at mean batch "
        f"{scr.format_rate(batch)} vs baseline {scr.format_rate(baseline)} tok/s ({source})"
        + (f": {speedup:.2f}x" if speedup is not None else "")
    )
    if speedup is not None and speedup >= 1.0:
        return Check("baseline", "OK", f"speculation is faster: {text}", data)
    advice = (
        "; a configured baseline must be measured at the batch size the server runs "
        f"(here {scr.format_rate(batch)}), else re-measure it there"
        if source == catalog.BASELINE_SOURCE_CONFIGURED else ""
    )
    return Check("baseline", "FAIL",
                 f"speculation is slower than the baseline: {text}; turn it off or fix "
                 f"acceptance{advice}", data)


def run(args: argparse.Namespace) -> int:
    """``specobs doctor``; see the module docstring."""
    try:
        url = scr.normalize_url(args.url)
    except ValueError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 2
    if not args.wait >= 0 or not (0 < args.timeout < math.inf):
        print(f"{_PROG}: --wait must be >= 0 and --timeout > 0 seconds", file=sys.stderr)
        return 2
    try:
        import httpx  # noqa: F401
        import prometheus_client  # noqa: F401 - the parser
    except ImportError as exc:
        print(f"{_PROG}: {exc.name or exc} is missing: pip install 'specobs[cli,prometheus]'",
              file=sys.stderr)
        return 1
    with _http.http_client(args) as client:
        checks = diagnose(client, url, args.wait, _http.limits_from(args))
    failed = any(c.verdict == "FAIL" for c in checks)
    # Credentials in the URL went to the server (HTTP Basic), never to the output.
    url = _http.display_url(url)
    if args.json:
        print(json.dumps(
            {"url": url, "ok": not failed, "checks": [asdict(c) for c in checks]},
            indent=2, sort_keys=True, default=str,
        ))
    else:
        width = max(len(c.name) for c in checks)
        print(f"{_PROG} {url}")
        for c in checks:
            print(f"{c.verdict:<4}  {c.name:<{width}}  {c.reason}")
        counts = {v: sum(c.verdict == v for c in checks) for v in ("FAIL", "WARN", "OK", "SKIP")}
        print(", ".join(f"{k} {n}" for k, n in counts.items() if n))
    sys.stdout.flush()
    return 1 if failed else 0
