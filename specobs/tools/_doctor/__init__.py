"""``specobs doctor``: a one-shot health check of a specobs /metrics endpoint.

    specobs doctor http://127.0.0.1:9477/metrics [--wait 2] [--min-cycles N] [--json]
                                                 [--against run.jsonl]
                                                 [--timeout 5] [--max-bytes 16MiB]
    specobs doctor --prometheus http://prometheus:9090 --instance 10.0.0.7:9477
                   [--selector '{job="specobs"}'] [--window 5m] [--history 1h] [--json]

It scrapes the endpoint twice, ``--wait`` seconds apart (the second time asking for OpenMetrics,
which also carries the exemplars), and prints one line per check of the endpoint with a verdict —
OK, INFO (expected here, nothing to change), WARN, FAIL, or SKIP when a check cannot run — and the
reason, then the **findings** of the diagnosis (:mod:`specobs.tools._diagnosis`,
docs/diagnosis.md) on the interval between the scrapes and against the lifetime before the first:
the acceptance profile, where the cycle goes, whether the host holds the GPU back, a stall, the
speedup and its reason, what changed recently. The checks:

=================  ===========================================================================
reachable          the URL answers HTTP 200
specobs endpoint   the body is Prometheus text with a ``specobs_info`` series
contract series    every catalog series is exposed (the missing ones are listed)
cycles advancing   ``specobs_cycles_total`` grew between the two scrapes; no cycle while
                   requests run or wait fails (a stall, as the generated alert pages)
gpu clock          GPU-clock series with a count > 0, or why not (clock=host, CUDA not up)
dropped records    records dropped, by reason, as a fraction of cycles
exporter errors    hot-path misuse counted by the exporter, by kind
overhead           ``specobs_exporter_overhead_ratio`` against the overhead budget
exporter cpu       the exporter's CPU seconds per cycle between the scrapes (budget 15 µs)
exemplars          OpenMetrics exposition carries trace exemplars
baseline           realized speedup: per-sequence tokens/s over the non-speculative baseline,
                   configured or measured by the engine (its ``source`` label), as the
                   recording rules compute it; below 1 fails, with the reason from the data
=================  ===========================================================================

The exit status is 0 when healthy, 1 when a check WARNs or FAILs or a finding is warn or fail
(a problem to act on), and 2 when the endpoint is unusable (unreachable, not a specobs endpoint,
the second scrape failed), the command line is bad or ``--against`` names no saved run.

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
over ``--window`` for the servers ``--instance`` and ``--selector`` match (one server, or their
sum, which the ``one server`` line says), against the ``--history`` before the window; the
endpoint's checks give way to ``prometheus`` (the query answered, with the servers matched;
exit 2 when not) and ``history``.

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
from specobs.tools import _diagnosis as dg
from specobs.tools import _http
from specobs.tools import _promapi as pa
from specobs.tools import _scrape as scr

__all__ = [
    "Check", "Report", "SavedRun", "add_arguments", "against_saved", "diagnose", "examine",
    "examine_prometheus", "exit_code", "load_saved_run", "render_text", "run",
]

_PROG = "specobs doctor"

#: DESIGN.md: everything specobs does on the worker's CPU, per cycle, at 1,000 cycles/s.
CPU_BUDGET_SECONDS_PER_CYCLE = 15e-6
#: Cycles between the scrapes below which the exporter's CPU per cycle is not judged: the
#: scrape's own fixed cost, spread over few cycles, reads as over budget.
CPU_MIN_CYCLES = 1000.0
#: Under the adaptive sampler, an overhead ratio up to this multiple of the budget is the
#: sampler converging (INFO); above it, a WARN.
ADAPTIVE_TOLERANCE = 2.0
#: How often the window is scraped again while ``--min-cycles`` waits for cycles.
MIN_CYCLES_POLL_SECONDS = 0.5
#: Checks whose failure leaves nothing to diagnose: the endpoint is unusable (exit 2).
UNUSABLE_CHECKS = ("reachable", "specobs endpoint", "prometheus")
#: Dropped records above this fraction of cycles fail the check (below it: a warning).
DROP_FAIL_FRACTION = 0.10
#: Series an endpoint may legitimately leave out: those the catalog marks optional (they exist
#: only once configured or fed, or where the kernel keeps them).
OPTIONAL_METRICS: tuple[catalog.Metric, ...] = tuple(m for m in catalog.CATALOG if m.optional)
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
    parser.add_argument("url", nargs="?", default=None,
                        help="a specobs /metrics URL, e.g. http://127.0.0.1:9477/metrics "
                             "(host:port means http://host:port/metrics)")
    parser.add_argument("--prometheus", metavar="URL", default=None,
                        help="diagnose one server from a Prometheus server instead: "
                             "increase() over --window, against the --history before it")
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
    _http.add_limit_arguments(parser)
    parser.add_argument("--against", metavar="FILE", default=None,
                        help="also compare the window with a run saved earlier by "
                             "'specobs report --save FILE' (SPEC-SAVED-* findings)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


@dataclass
class Check:
    """One line of the report."""

    name: str
    verdict: str  # OK | INFO | WARN | FAIL | SKIP
    reason: str
    data: dict[str, Any] = field(default_factory=dict)


def _skip_rest(checks: list[Check], reason: str) -> list[Check]:
    done = {c.name for c in checks}
    return checks + [Check(n, "SKIP", reason) for n in CHECK_NAMES if n not in done]


def _fmt_count(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"


def _budget(s: scr.Series) -> float | None:
    """The adaptive sampler's overhead budget as the endpoint exports it (its gauge); ``None``
    under a fixed interval, which no budget steers."""
    values = [v for (n, _), v in s.samples.items() if n == catalog.SAMPLING_BUDGET.name]
    return max(values) if values else None


@dataclass
class Report:
    """What ``specobs doctor`` found: the endpoint's checks and the speculation's findings."""

    checks: list[Check]
    findings: list[dg.Finding] = field(default_factory=list)
    #: The window diagnosed (None when the endpoint or the data left nothing to diagnose).
    recent: dg.Window | None = None

    @property
    def unusable(self) -> bool:
        """The endpoint could not be read twice as a specobs endpoint: nothing to diagnose."""
        return any(c.verdict == "FAIL" and c.name in UNUSABLE_CHECKS for c in self.checks) or \
            any(c.verdict == "FAIL" and c.name == "cycles advancing"
                and c.data.get("second_scrape_failed") for c in self.checks)

    @property
    def problem(self) -> bool:
        """A check that WARNs or FAILs, or a finding of severity warn or fail."""
        return any(c.verdict in ("WARN", "FAIL") for c in self.checks) or \
            dg.worst(self.findings) in ("warn", "fail")


def exit_code(report: Report) -> int:
    """2 when the endpoint is unusable, 1 when doctor found a problem, 0 when healthy."""
    if report.unusable:
        return 2
    return 1 if report.problem else 0


def diagnose(
    client: Any, url: str, wait_seconds: float, limits: _http.Limits = _http.DEFAULT_LIMITS,
) -> list[Check]:
    """The checks of :func:`examine` (the findings left out)."""
    return examine(client, url, wait_seconds, limits).checks


def _lifetime(first: scr.Scrape) -> scr.Delta:
    """The lifetime before the first scrape, as one interval: its counters from zero, its
    seconds from the cycle counter's ``_created`` time when the endpoint serves it."""
    created = first.series.total(catalog.CYCLES.name.removesuffix("_total") + "_created")
    elapsed = max(0.0, time.time() - created) if created else 0.0
    delta = scr.difference(scr.Scrape(scr.Series(), first.monotonic_seconds - elapsed), first)
    assert isinstance(delta, scr.Delta)  # nothing goes down from an empty scrape
    return delta


def examine(
    client: Any, url: str, wait_seconds: float, limits: _http.Limits = _http.DEFAULT_LIMITS,
    min_cycles: float = 0.0, max_wait_seconds: float = 60.0,
) -> Report:
    """Run every check against ``url`` and diagnose the speculation between the two scrapes,
    against the lifetime before the first; see the module docstring. Two requests in all,
    unless ``min_cycles`` keeps the window open (a new second scrape every
    :data:`MIN_CYCLES_POLL_SECONDS` until that many cycles ran or ``max_wait_seconds`` passed
    since the first)."""
    checks: list[Check] = []

    # reachable / specobs endpoint
    t0 = time.monotonic()
    try:
        text, content_type = scr.fetch_text(client, url, limits=limits)
    except scr.ScrapeError as exc:
        checks.append(Check("reachable", "FAIL", str(exc)))
        return Report(_skip_rest(checks, "needs a reachable endpoint"))
    ms = (time.monotonic() - t0) * 1e3
    checks.append(Check(
        "reachable", "OK", f"HTTP 200 in {ms:.0f} ms, {len(text.encode()) / 1024:.1f} KiB",
        {"milliseconds": ms, "bytes": len(text.encode()), "content_type": content_type},
    ))
    try:
        series = scr.parse_exposition(text)
    except scr.ScrapeError as exc:
        checks.append(Check("specobs endpoint", "FAIL", f"{_http.display_url(url)}: {exc}"))
        return Report(_skip_rest(checks, "needs a specobs endpoint"))
    first = scr.Scrape(series, t0, text)
    if not first.is_specobs:
        checks.append(Check("specobs endpoint", "FAIL", scr.not_specobs_message(url, series)))
        return Report(_skip_rest(checks, "needs a specobs endpoint"))
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
        checks.append(Check("cycles advancing", "FAIL", f"second scrape failed: {exc}",
                            {"second_scrape_failed": True}))
        return Report(_skip_rest(checks, "needs two scrapes"))
    delta = scr.difference(first, second)
    while (min_cycles > 0 and isinstance(delta, scr.Delta)
           and (delta.counters.total(catalog.CYCLES.name) or 0.0) < min_cycles
           and time.monotonic() - t0 + MIN_CYCLES_POLL_SECONDS <= max_wait_seconds):
        time.sleep(MIN_CYCLES_POLL_SECONDS)
        try:
            second = scr.scrape(client, url, openmetrics=True, limits=limits)
        except scr.ScrapeError as exc:
            checks.append(Check("cycles advancing", "FAIL", f"second scrape failed: {exc}",
                                {"second_scrape_failed": True}))
            return Report(_skip_rest(checks, "needs two scrapes"))
        delta = scr.difference(first, second)
    b: bd.Breakdown | None = None
    findings: list[dg.Finding] = []
    speed: dg.Finding | None = None
    window: dg.Window | None = None
    if isinstance(delta, scr.CounterReset):
        checks.append(Check("cycles advancing", "INFO",
                            f"{delta} between the two scrapes: run doctor again"))
    else:
        recent = dg.window(delta, time.time())
        past = dg.window(_lifetime(first))
        b = recent.breakdown
        findings = dg.diagnose(recent, past)
        speed = next((f for f in findings if f.code.startswith("SPEC-SPEEDUP-")), None)
        elapsed = delta.elapsed_seconds
        window = recent
        if b.cycles > 0:
            checks.append(Check(
                "cycles advancing", "OK",
                f"{_fmt_count(b.cycles)} cycles in {elapsed:.1f} s "
                f"({scr.format_rate(b.cycles_per_second)}/s)",
                {"cycles": b.cycles, "seconds": elapsed},
            ))
        else:
            idle = dg.stall(recent)
            assert idle is not None  # no cycles: stalled, idle or cannot tell
            checks.append(Check(
                "cycles advancing", "FAIL" if idle.severity == "fail" else "INFO",
                idle.sentence, {"cycles": 0.0, "seconds": elapsed, "finding": idle.code},
            ))

    s2 = second.series
    info = second.info or info
    cycles_total = s2.total(catalog.CYCLES.name) or 0.0
    checks.append(_gpu_clock(s2, info, cycles_total))
    checks.append(_drops(s2, cycles_total))
    checks.append(_errors(s2))
    checks.append(_overhead(s2, info, b.cycle_mean_seconds.get("host") if b else None))
    checks.append(_cpu(b))
    checks.append(_exemplars(second))
    checks.append(_baseline(b, s2, speed))
    return Report(checks, findings, window)


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
        return Check("gpu clock", "INFO", "no cycles yet: cannot tell whether the GPU clock "
                                          "works", data)
    if sampled <= 0 and clock in ("none", "auto"):
        # Expected, not a fault: a CPU-only process, or one configured for the host clock.
        why = (
            "configured with clock=host (gpu_clock=\"none\")" if clock == "none"
            else "clock=auto and the process has not initialised CUDA (gpu_clock=\"auto\": a "
                 "CPU-only process, or CUDA started after specobs looked)"
        )
        return Check("gpu clock", "INFO", f"host clock only: {why}", data)
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


#: What specobs may cost a cycle in all (DESIGN.md's throughput budgets): the gauge counts the
#: GPU-timed cycles' event records (what the sampler's budget governs) and, besides, the phase
#: boundaries and the resolver every cycle pays, so a short cycle is allowed more.
COST_LIMITS = ((2e-3, 0.003), (0.5e-3, 0.005), (0.0, 0.01))


def cost_limit(cycle_seconds: float | None) -> float:
    """The whole cost the design allows a cycle of this length (0.5 % when it is not known)."""
    if cycle_seconds is None or not math.isfinite(cycle_seconds) or cycle_seconds <= 0:
        return 0.005
    return next(limit for floor, limit in COST_LIMITS if cycle_seconds >= floor)


def _overhead(s: scr.Series, info: dict[str, str], cycle_seconds: float | None = None) -> Check:
    # The sampler's budget covers the event records only; the gauge adds the costs every cycle
    # pays, so it is judged against the larger of the budget and the design's whole-cost limit.
    budget = max(_budget(s) or 0.0, cost_limit(cycle_seconds))
    values = [v for (n, _), v in s.samples.items() if n == catalog.OVERHEAD_RATIO.name]
    if not values:
        return Check("overhead", "SKIP", f"no {catalog.OVERHEAD_RATIO.name} series")
    ratio = max(values)
    data = {"overhead_ratio": ratio, "budget": budget}
    text = f"{scr.format_percent(ratio, 2)} of cycle time vs budget {scr.format_percent(budget, 2)}"
    if ratio <= budget:
        return Check("overhead", "OK", text, data)
    sampling = info.get("sampling", "")
    if sampling.startswith("every_"):
        return Check("overhead", "WARN",
                     f"{text}, over budget; sampling is fixed ({sampling}): leave "
                     "SPECOBS_SAMPLE_EVERY unset for the adaptive sampler", data)
    if ratio <= ADAPTIVE_TOLERANCE * budget:
        # The adaptive sampler steers the ratio onto the budget: a little above it is the
        # sampler at work (it measures, then lengthens the interval), not a fault.
        return Check("overhead", "INFO",
                     f"{text}: at the budget, where the adaptive sampler holds it", data)
    return Check("overhead", "WARN",
                 f"{text}, over {ADAPTIVE_TOLERANCE:g}x the budget: the adaptive sampler cannot "
                 "hold it (GPU timing costs more than the budget even at the longest interval)",
                 data)


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
    if b.cycles < CPU_MIN_CYCLES:
        # The scrapes' own encoding, spread over few cycles, is most of such a figure.
        return Check("exporter cpu", "INFO",
                     f"{text}, over only {_fmt_count(b.cycles)} cycles: too few to judge "
                     f"(the scrapes' own cost dominates; {CPU_MIN_CYCLES:.0f} needed, raise "
                     "--wait)", data)
    return Check("exporter cpu", "WARN", f"{text}, over budget", data)


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
    # A setting, not a fault: tracing is off unless a trace sink is configured.
    return Check("exemplars", "INFO",
                 "no trace exemplars in OpenMetrics: tracing is off (no trace sink, or "
                 "SPECOBS_TRACE_HEAD_RATE=0) or no cycle was traced yet", {"exemplars": 0})


#: Gauges the diagnosis reads from Prometheus besides the breakdown's own.
_DIAGNOSIS_GAUGES = (catalog.REQUESTS_RUNNING, catalog.REQUESTS_WAITING,
                     catalog.LAST_CYCLE_TIMESTAMP)


def examine_prometheus(
    client: Any, base_url: str, selector: str, window_seconds: float, history_seconds: float,
    limits: _http.Limits = _http.DEFAULT_LIMITS, now: float | None = None,
) -> Report:
    """Diagnose the servers ``selector`` matches from a Prometheus server: ``increase()`` over
    the last ``window_seconds`` against the ``history_seconds`` before it (the same breakdown
    and findings as two scrapes give; the endpoint checks do not apply)."""
    at = time.time() if now is None else now
    shown = f"{_http.display_url(base_url)} {{{selector}}}"
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
    findings = dg.diagnose(window, past)
    if len(instances) == 1 and instances[0] and not any(f.code == "SPEC-STALL"
                                                         for f in findings):
        findings += _against_cohort(client, base_url, recent, window, instances[0],
                                    window_seconds, limits, at, checks)
    return Report(checks, findings, window)


#: The labels that make a cohort, as the generated rules group servers (MixinConfig's
#: cohort_by): the same model on the same engine, in one cluster and namespace where present.
COHORT_LABELS = ("cluster", "namespace", "model_name", "serving_engine")


def _against_cohort(client: Any, base_url: str, recent: scr.Delta, window: dg.Window,
                    instance: str, window_seconds: float, limits: _http.Limits, at: float,
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


_VERDICT = {"ok": "OK", "info": "INFO", "warn": "WARN", "fail": "FAIL"}


def _baseline(b: bd.Breakdown | None, s: scr.Series, speed: dg.Finding | None) -> Check:
    """The realized speedup, in the words of the diagnosis's speedup finding."""
    baseline = s.total(catalog.BASELINE_SEQUENCE_TOKENS.name)
    if baseline is None:
        return Check("baseline", "SKIP",
                     "no baseline configured (configure(baseline_tokens_per_second=...) or "
                     "SPECOBS_BASELINE_TOKENS_PER_SECOND) and none measured by the engine")
    labels = s.labels(catalog.BASELINE_SEQUENCE_TOKENS.name)
    # The recording rules call a baseline without a source label "configured".
    source = (labels[0].get("source") if labels else None) or catalog.BASELINE_SOURCE_CONFIGURED
    if b is None or b.sequence_tokens_per_second is None or speed is None:
        return Check("baseline", "SKIP",
                     "no cycles with tokens between the two scrapes: cannot measure "
                     f"(baseline {scr.format_rate(baseline)} tok/s, {source})",
                     {"baseline": baseline, "source": source})
    realized = b.sequence_tokens_per_second
    speedup, _ = bd.speedups(b)
    batch = b.mean_batch_size
    data = {"realized": realized, "baseline": baseline, "speedup": speedup, "source": source,
            "mean_batch_size": batch, "finding": speed.code}
    advice = (
        "; a configured baseline must be measured at the batch size the server runs "
        f"(here {scr.format_rate(batch)}), else re-measure it there"
        if source == catalog.BASELINE_SOURCE_CONFIGURED and speed.severity == "fail" else ""
    )
    return Check("baseline", _VERDICT[speed.severity], f"{speed.sentence} ({source}){advice}",
                 data)


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
            matchers = [pa.normalize_selector(args.selector)] if args.selector else []
            if args.instance is not None:
                matchers.append(f"instance={json.dumps(args.instance)}")
            selector = ",".join(m for m in matchers if m)
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
        return 1
    saved: SavedRun | None = None
    if args.against is not None:
        try:
            saved = load_saved_run(args.against)
        except ValueError as exc:
            print(f"{_PROG}: --against: {exc}", file=sys.stderr)
            return 2
    with _http.http_client(args) as client:
        if prometheus:
            report = examine_prometheus(client, url, selector, window, history,
                                        _http.limits_from(args))
        else:
            report = examine(client, url, args.wait, _http.limits_from(args),
                             min_cycles=args.min_cycles, max_wait_seconds=args.max_wait)
    if saved is not None:
        against_saved(report, saved)
    code = exit_code(report)
    # Credentials in the URL went to the server (HTTP Basic), never to the output.
    url = _http.display_url(url)
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
