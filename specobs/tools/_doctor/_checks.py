"""The endpoint's checks (:data:`CHECK_NAMES`, each a :class:`Check` with its verdict and
reason), the :class:`Report` they and the findings make, and :func:`examine`: two scrapes of a
/metrics endpoint, checked and diagnosed."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from specobs import catalog
from specobs.sampling import MAX_INTERVAL
from specobs.tools import _breakdown as bd
from specobs.tools import _client
from specobs.tools import _diagnosis as dg
from specobs.tools import _scrape as scr

__all__ = [
    "CHECK_NAMES", "EXEMPLAR_PATTERN", "MIN_CYCLES_POLL_SECONDS", "Check", "Report", "cost_limit",
    "diagnose", "examine", "exit_code",
]

#: DESIGN.md: what specobs does on the worker's CPU per cycle, at 1,000 cycles/s (its benchmark
#: scrapes every 5 s, so a scrape's cost is a small share of it there).
CPU_BUDGET_SECONDS_PER_CYCLE = 15e-6
#: The ``specobs_exporter_cpu_time_seconds_total`` component of /metrics scrapes. Its cost comes
#: per scrape, and doctor scrapes far more often than Prometheus does: counted per cycle, doctor's
#: own requests would be judged. The check gives it per scrape instead, and does not judge it.
SCRAPE_CPU_COMPONENT = bd.SCRAPE_CPU_COMPONENT
#: Cycles between the scrapes below which the exporter's CPU per cycle is not judged when over
#: budget: a cost paid now and then rather than per cycle (an OTLP push, the resolver's periodic
#: work) weighs on few cycles.
CPU_MIN_CYCLES = 1000.0
#: A window without cycles is kept open until it spans this many of the lifetime's mean cycle
#: (at most ``--max-wait``): a shorter one cannot tell a stall from the next cycle not done yet.
NO_CYCLE_MIN_CYCLES = 10.0
#: Cycles from this long on: the overhead gauge reads high (its host-side parts run while the
#: engine waits on the GPU; docs/metrics.md).
LONG_CYCLE_SECONDS = 2e-3
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
    return s.max(catalog.SAMPLING_BUDGET.name)


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
    client: Any, url: str, wait_seconds: float, limits: _client.Limits = _client.DEFAULT_LIMITS,
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


def _no_cycle_seconds(lifetime: bd.Breakdown) -> float:
    """How long a window without cycles must be before it says a stall or idle: ten of the
    lifetime's mean cycles on the host clock; 0 (no bound) when the lifetime has none."""
    mean = lifetime.cycle_mean_seconds.get("host")
    if mean is None or not math.isfinite(mean) or mean <= 0:
        return 0.0
    return NO_CYCLE_MIN_CYCLES * mean


def examine(
    client: Any, url: str, wait_seconds: float, limits: _client.Limits = _client.DEFAULT_LIMITS,
    min_cycles: float = 0.0, max_wait_seconds: float = 60.0,
) -> Report:
    """Run every check against ``url`` and diagnose the speculation between the two scrapes,
    against the lifetime before the first; see the module docstring. Two requests in all,
    unless ``min_cycles`` keeps the window open (a new second scrape every
    :data:`MIN_CYCLES_POLL_SECONDS` until that many cycles ran or ``max_wait_seconds`` passed
    since the first)."""
    checks: list[Check] = []
    opened = _open(client, url, limits, checks)
    if isinstance(opened, str):
        return Report(_skip_rest(checks, opened))
    first, t0 = opened
    checks.append(_contract(first.series))
    past = dg.window(_lifetime(first))
    polled = _poll(client, url, limits, first, t0, _no_cycle_seconds(past.breakdown),
                   wait_seconds, min_cycles, max_wait_seconds)
    if isinstance(polled, Check):
        checks.append(polled)
        return Report(_skip_rest(checks, "needs two scrapes"))
    second, delta, scrapes = polled
    b: bd.Breakdown | None = None
    findings: list[dg.Finding] = []
    window: dg.Window | None = None
    if isinstance(delta, scr.CounterReset):
        checks.append(Check("cycles advancing", "INFO",
                            f"{delta} between the two scrapes: run doctor again"))
    else:
        window = dg.window(delta, time.time())
        b = window.breakdown
        findings = dg.diagnose(window, past)
        checks.append(_advancing(window, delta.elapsed_seconds))
    speed = next((f for f in findings if f.code.startswith("SPEC-SPEEDUP-")), None)
    s2 = second.series
    info = second.info or first.info
    cycles_total = s2.total(catalog.CYCLES.name) or 0.0
    checks.append(_gpu_clock(s2, info, cycles_total))
    checks.append(_drops(s2, cycles_total))
    checks.append(_errors(s2))
    checks.append(_overhead(s2, info, b.cycle_mean_seconds.get("host") if b else None,
                            b.acceptance_copy_seconds_per_cycle if b else None))
    checks.append(_cpu(b, delta, scrapes, max_wait_seconds))
    checks.append(_exemplars(second))
    checks.append(_baseline(b, s2, speed))
    return Report(checks, findings, window)


def _open(client: Any, url: str, limits: _client.Limits,
          checks: list[Check]) -> tuple[scr.Scrape, float] | str:
    """The first scrape and when it began, with the reachable and specobs endpoint checks
    appended to ``checks``; where either fails, what the other checks need."""
    t0 = time.monotonic()
    try:
        text, content_type = scr.fetch_text(client, url, limits=limits)
    except scr.ScrapeError as exc:
        checks.append(Check("reachable", "FAIL", str(exc)))
        return "needs a reachable endpoint"
    ms = (time.monotonic() - t0) * 1e3
    checks.append(Check(
        "reachable", "OK", f"HTTP 200 in {ms:.0f} ms, {len(text.encode()) / 1024:.1f} KiB",
        {"milliseconds": ms, "bytes": len(text.encode()), "content_type": content_type},
    ))
    try:
        series = scr.parse_exposition(text)
    except scr.ScrapeError as exc:
        checks.append(Check("specobs endpoint", "FAIL", f"{_client.display_url(url)}: {exc}"))
        return "needs a specobs endpoint"
    first = scr.Scrape(series, t0, text)
    if not first.is_specobs:
        checks.append(Check("specobs endpoint", "FAIL", scr.not_specobs_message(url, series)))
        return "needs a specobs endpoint"
    info = first.info
    checks.append(Check(
        "specobs endpoint", "OK",
        f"specobs {info.get('version', '?')}, phases {info.get('phases', '?')}, "
        f"gpu_clock={info.get('gpu_clock', '?')}, sampling {info.get('sampling', '?')}",
        {"info": info},
    ))
    return first, t0


def _contract(series: scr.Series) -> Check:
    """Every series of the catalog's contract is exported (the optional ones are named)."""
    names = series.names()
    required = [m for m in catalog.CATALOG if m not in OPTIONAL_METRICS]
    missing = [s for m in required for s in m.series() if s not in names]
    absent_optional = [m.name for m in OPTIONAL_METRICS if not any(
        s in names for s in m.series()
    )]
    if missing:
        return Check(
            "contract series", "FAIL",
            f"{len(missing)} catalog series missing: {', '.join(missing)}",
            {"missing": missing, "absent_optional": absent_optional},
        )
    note = f" (not set: {', '.join(absent_optional)})" if absent_optional else ""
    return Check(
        "contract series", "OK", f"all {len(required)} contract metrics present{note}",
        {"missing": [], "absent_optional": absent_optional},
    )


def _poll(client: Any, url: str, limits: _client.Limits, first: scr.Scrape, t0: float,
          shortest: float, wait_seconds: float, min_cycles: float,
          max_wait_seconds: float) -> tuple[scr.Scrape, scr.Delta | scr.CounterReset, int] | Check:
    """The second scrape, as OpenMetrics so that it also shows the exemplars, its difference
    from the first and how many scrapes fell within the window (the first and each poll but the
    last); the failed check where it could not be read. After ``wait_seconds`` it is scraped
    again every :data:`MIN_CYCLES_POLL_SECONDS`, until the next poll would pass
    ``max_wait_seconds``, while fewer than ``min_cycles`` cycles ran or a window without cycles
    is shorter than ``shortest`` (too short to call a stall)."""
    pause = max(0.0, wait_seconds)
    scrapes = 0
    while True:
        time.sleep(pause)
        try:
            second = scr.scrape(client, url, openmetrics=True, limits=limits)
        except scr.ScrapeError as exc:
            return Check("cycles advancing", "FAIL", f"second scrape failed: {exc}",
                         {"second_scrape_failed": True})
        scrapes += 1
        delta = scr.difference(first, second)
        if not isinstance(delta, scr.Delta) or \
                time.monotonic() - t0 + MIN_CYCLES_POLL_SECONDS > max_wait_seconds:
            return second, delta, scrapes
        ran = delta.counters.total(catalog.CYCLES.name) or 0.0
        if not (ran < min_cycles or (ran <= 0 and delta.elapsed_seconds < shortest)):
            return second, delta, scrapes
        pause = MIN_CYCLES_POLL_SECONDS


def _advancing(recent: dg.Window, elapsed: float) -> Check:
    """Cycles ran in the window; where none did, stalled, idle or cannot tell."""
    b = recent.breakdown
    if b.cycles > 0:
        return Check(
            "cycles advancing", "OK",
            f"{_fmt_count(b.cycles)} cycles in {elapsed:.1f} s "
            f"({scr.format_rate(b.cycles_per_second)}/s)",
            {"cycles": b.cycles, "seconds": elapsed},
        )
    idle = dg.stall(recent)
    assert idle is not None  # no cycles: stalled, idle or cannot tell
    return Check(
        "cycles advancing", "FAIL" if idle.severity == "fail" else "INFO",
        idle.sentence, {"cycles": 0.0, "seconds": elapsed, "finding": idle.code},
    )


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
            else "the process has not initialised CUDA (clock=auto: a CPU-only process, or "
                 "CUDA started after specobs looked)"
        )
        return Check("gpu clock", "INFO", f"host clock only: {why}", data)
    return Check(
        "gpu clock", "WARN",
        f"{_fmt_count(sampled)} cycles sampled but none resolved on the GPU clock "
        f"(gpu_clock={clock}): events still pending, or every sampled cycle was dropped", data,
    )


def _drops(s: scr.Series, cycles_total: float) -> Check:
    by_reason = {k: v for k, v in s.by(catalog.DROPPED_RECORDS.name, "reason").items() if v > 0}
    raised = by_reason.pop(catalog.DROP_REASON_EXCEPTION, 0.0)
    total = math.fsum(by_reason.values())
    data: dict[str, Any] = {"by_reason": by_reason, "cycles": cycles_total,
                            "engine_raised": raised}

    def of_cycles(n: float) -> str:
        f = bd.ratio(n, cycles_total)
        return (f"{scr.format_percent(f, 2)} of {_fmt_count(cycles_total)} cycles"
                if f is not None else "no cycles counted")

    engine = (f"{_fmt_count(raised)} cycles discarded because the engine raised inside them "
              f"({of_cycles(raised)}): the engine's failure, see its log") if raised else ""
    if total <= 0:
        if raised:
            return Check("dropped records", "WARN", f"none dropped by specobs; {engine}", data)
        return Check("dropped records", "OK", "none dropped", data)
    fraction = bd.ratio(total, cycles_total)
    parts = ", ".join(f"{k} {_fmt_count(v)}" for k, v in sorted(by_reason.items()))
    verdict = "FAIL" if fraction is None or fraction > DROP_FAIL_FRACTION else "WARN"
    data["fraction"] = fraction
    reason = f"{_fmt_count(total)} dropped ({parts}), {of_cycles(total)}"
    return Check("dropped records", verdict, f"{reason}; {engine}" if raised else reason, data)


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


def _overhead(s: scr.Series, info: dict[str, str], cycle_seconds: float | None = None,
              copy_seconds_per_cycle: float | None = None) -> Check:
    # The sampler's budget covers the event records only; the gauge adds the costs every cycle
    # pays, so it is judged against the larger of the budget and the design's whole-cost limit.
    budget = max(_budget(s) or 0.0, cost_limit(cycle_seconds))
    ratio = s.max(catalog.OVERHEAD_RATIO.name)
    if ratio is None:
        return Check("overhead", "SKIP", f"no {catalog.OVERHEAD_RATIO.name} series")
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
    copies = bd.ratio(copy_seconds_per_cycle, cycle_seconds)
    if copies is not None and copies >= ratio / 2:
        # A cost every cycle pays that sampling does not touch: name it, or the reader tunes
        # the sampler for nothing.
        data["acceptance_copy_ratio"] = copies
        return Check("overhead", "WARN",
                     f"{text}, over {ADAPTIVE_TOLERANCE:g}x the budget: copying the CUDA "
                     f"acceptance tensor to the host takes {scr.format_percent(copies, 2)} of "
                     "each cycle on the engine's thread (one device-to-host copy a cycle, "
                     "whatever the sampler does); hand accept() host data where the engine has "
                     "it (docs/integrations.md, 'Acceptance: pass host data')", data)
    interval = s.max(catalog.SAMPLING_INTERVAL.name)
    if interval is not None and interval < MAX_INTERVAL:
        # The sampler could sample less and does not need to: what exceeds the budget is paid
        # every cycle whatever it does.
        data["sampling_interval"] = interval
        long = cycle_seconds is not None and cycle_seconds >= LONG_CYCLE_SECONDS
        return Check("overhead", "WARN",
                     f"{text}, over {ADAPTIVE_TOLERANCE:g}x the budget with the sampler at 1 in "
                     f"{interval:.0f} (it may go to 1 in {MAX_INTERVAL}): the "
                     "excess is what every cycle pays besides GPU timing (phase boundaries, the "
                     "resolver's CPU, acceptance copies)"
                     + ("; on cycles this long the gauge reads high, as the engine waits on the "
                        "GPU meanwhile: measure the loss before acting (docs/metrics.md)"
                        if long else ""), data)
    return Check("overhead", "WARN",
                 f"{text}, over {ADAPTIVE_TOLERANCE:g}x the budget: the adaptive sampler cannot "
                 "hold it (GPU timing costs more than the budget even at the longest interval)",
                 data)


def _micros(seconds: float) -> str:
    """Seconds as microseconds, with two decimals below one."""
    us = seconds * 1e6
    return f"{us:.2f}" if us < 1 else f"{us:.1f}"


def _cpu(b: bd.Breakdown | None, delta: scr.Delta | scr.CounterReset, scrapes: int,
         max_wait_seconds: float) -> Check:
    """The exporter's CPU per cycle, its /metrics scrapes left out and given per scrape.

    ``scrapes`` is how many scrapes doctor made whose rendering falls inside the window: the
    endpoint books a scrape's CPU after the snapshot it serves, so the first scrape's is in the
    window and the last one's is not."""
    if b is None or not isinstance(delta, scr.Delta) or b.cycles <= 0:
        return Check("exporter cpu", "SKIP", "no cycles between the two scrapes")
    by_component = {k: max(0.0, v) for k, v in
                    delta.counters.by(catalog.EXPORTER_CPU.name, "component").items()}
    if not by_component:
        return Check("exporter cpu", "SKIP", f"no {catalog.EXPORTER_CPU.name} series")
    scrape_cpu = by_component.pop(SCRAPE_CPU_COMPONENT, None)
    per = math.fsum(by_component.values()) / b.cycles
    budget = CPU_BUDGET_SECONDS_PER_CYCLE
    data: dict[str, Any] = {
        "seconds_per_cycle": per, "budget_seconds_per_cycle": budget, "cycles": b.cycles,
        "components_per_cycle": {k: v / b.cycles for k, v in sorted(by_component.items())},
        "scrapes": scrapes, "scrape_seconds": scrape_cpu,
        "seconds_per_scrape": scrape_cpu / scrapes if scrape_cpu is not None and scrapes else None,
        "judged": True,
    }
    parts = ", ".join(c.replace("_", " ") for c in sorted(by_component)) or "none"
    scrape = ""
    if data["seconds_per_scrape"] is not None:
        scrape = (f"; /metrics scrapes, apart: {scr.format_seconds(data['seconds_per_scrape'])} "
                  f"CPU each ({scrapes} by doctor in the window, and any other scraper's), paid "
                  "per scrape, not per cycle")
    text = f"{_micros(per)} µs CPU per cycle ({parts}; budget {budget * 1e6:.0f} µs)"
    if per <= budget:
        return Check("exporter cpu", "OK",
                     f"{text} over {_fmt_count(b.cycles)} cycles{scrape}", data)
    if b.cycles < CPU_MIN_CYCLES:
        # Not a verdict: say why and how to get one, with no figure set against the budget.
        data["judged"] = False
        rate = b.cycles_per_second
        how = f"run doctor with --min-cycles {CPU_MIN_CYCLES:.0f}"
        if rate:
            need = CPU_MIN_CYCLES / rate
            if need + MIN_CYCLES_POLL_SECONDS > max_wait_seconds:
                how += f" --max-wait {math.ceil(need * 1.5):.0f}"
            how += f" (about {need:.0f} s at {scr.format_rate(rate)} cycles/s)"
        return Check("exporter cpu", "INFO",
                     f"not judged: only {_fmt_count(b.cycles)} cycles in the window, "
                     f"{CPU_MIN_CYCLES:.0f} needed (a cost paid now and then, such as an OTLP "
                     f"push, weighs on few cycles); {how} for a verdict{scrape}", data)
    largest = sorted(data["components_per_cycle"].items(), key=lambda kv: -kv[1])
    each = ", ".join(f"{k.replace('_', ' ')} {_micros(v)} µs" for k, v in largest)
    return Check("exporter cpu", "WARN",
                 f"{text} over {_fmt_count(b.cycles)} cycles, over budget: {each}{scrape}", data)


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
