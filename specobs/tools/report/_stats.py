"""The metrics a report compares, and how ``--compare`` decides a change is beyond the noise.

Each :class:`MetricDef` reads one number out of a :class:`specobs.tools._breakdown.Breakdown` (the
same numbers ``specobs top`` shows), for the whole run and for every window of it.

**Significance.** A run's windows (one per sampling interval, or per ``--step`` from
Prometheus) are repeated measurements of the same server, so their spread is the run-to-run noise
of that metric at that window length. A change from A to B is *significant* when both hold:

1. **Beyond the noise:** Welch's t-test over the two runs' per-window values rejects "same mean"
   at ``alpha`` (default 0.01, two-sided; Welch-Satterthwaite degrees of freedom). Each run needs
   at least :data:`MIN_WINDOWS` windows with a value; fewer and the verdict is "too few windows".
2. **Large enough to matter:** the whole-run values differ by at least ``min_change`` relative
   (default 10 %; for metrics that are already fractions — acceptance, shares, drop ratios — by
   ``min_change`` of the larger value, at least one percentage point).

The second condition keeps a long, very steady run from flagging a 1 % drift a scheduler can
cause between two runs on a busy machine, which per-window variation inside one run cannot see.

**Load is context.** The mean batch size is the traffic, not a property of the server: a
significant change there is reported as "load differs" (a caveat for the timing and throughput
rows, as the alert rules excuse a slowdown that comes with batch growth), never as a finding.
Under closed-loop load it also follows from acceptance: a request that needs more cycles stays
in the batch longer.

**Roots and consequences.** Metrics are grouped (acceptance, timing, load, throughput, health).
Throughput and speedup are products of the others (tokens per sequence-cycle over cycle time, and
that over the baseline), so a significant throughput change is reported as a *consequence* of the
significant root changes that explain it, not as a finding of its own. The headline lists the
significant root metrics only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specobs.tools import _breakdown as bd

__all__ = [
    "MIN_WINDOWS",
    "Change",
    "MetricDef",
    "compare",
    "metric_defs",
    "t_critical",
    "welch",
]

#: Windows each run needs for a verdict.
MIN_WINDOWS = 4

# Two-sided critical values of Student's t (rows: df 1..30), for alpha 0.01 and 0.05.
_T_995 = (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169, 3.106, 3.055,
          3.012, 2.977, 2.947, 2.921, 2.898, 2.878, 2.861, 2.845, 2.831, 2.819, 2.807, 2.797,
          2.787, 2.779, 2.771, 2.763, 2.756, 2.750)
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
          2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
          2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# Beyond df 30: 40, 60, 120, infinity.
_T_TAIL = {0.01: ((40, 2.704), (60, 2.660), (120, 2.617), (math.inf, 2.576)),
           0.05: ((40, 2.021), (60, 2.000), (120, 1.980), (math.inf, 1.960))}


def t_critical(df: float, alpha: float = 0.01) -> float:
    """Two-sided critical t for ``alpha`` 0.01 or 0.05 (tabled; a conservative lower df)."""
    if alpha not in _T_TAIL:
        raise ValueError(f"alpha must be 0.01 or 0.05, got {alpha}")
    table = _T_995 if alpha == 0.01 else _T_975
    if df < 1:
        return table[0]
    if df <= 30:
        return table[math.floor(df) - 1]
    value = table[-1]
    for bound, t in _T_TAIL[alpha]:
        if df >= bound:
            value = t
    return value


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's t statistic and Welch-Satterthwaite degrees of freedom of ``b - a``.

    Identical constant samples give ``t = 0``; different constant samples ``t = ±inf``.
    """
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    va = statistics.variance(a) / len(a) if len(a) > 1 else 0.0
    vb = statistics.variance(b) / len(b) if len(b) > 1 else 0.0
    se2 = va + vb
    if se2 <= 0:
        return (0.0 if mb == ma else math.copysign(math.inf, mb - ma)), math.inf
    t = (mb - ma) / math.sqrt(se2)
    den = (va * va / (len(a) - 1) if len(a) > 1 else 0.0) + (
        vb * vb / (len(b) - 1) if len(b) > 1 else 0.0)
    df = se2 * se2 / den if den > 0 else math.inf
    return t, df


@dataclass(frozen=True)
class MetricDef:
    """One compared number: ``key`` is stable (tests and anchors), ``get`` reads a breakdown."""

    key: str
    label: str
    group: str  # acceptance | timing | load | throughput | health
    kind: str  # seconds | percent | rate | ratio | count
    get: Callable[[bd.Breakdown], float | None]
    #: For throughput: the groups whose roots explain it.
    explained_by: tuple[str, ...] = ()


def _phase_mean(phase: str, clock: str) -> Callable[[bd.Breakdown], float | None]:
    def get(b: bd.Breakdown) -> float | None:
        st = b.stats.get((phase, clock))
        return st.mean_seconds if st is not None else None
    return get


def _cycle_mean(clock: str) -> Callable[[bd.Breakdown], float | None]:
    return lambda b: b.cycle_mean_seconds.get(clock)


def _position(position: str) -> Callable[[bd.Breakdown], float | None]:
    def get(b: bd.Breakdown) -> float | None:
        return dict(b.position_acceptance).get(position)
    return get


def _drop_ratio(b: bd.Breakdown) -> float | None:
    return bd.ratio(b.dropped_total, b.cycles)


def _per_sequence_cycle(b: bd.Breakdown) -> float | None:
    host = b.cycle_mean_seconds.get("host")
    if b.sequence_tokens_per_second is None or host is None:
        return None
    return b.sequence_tokens_per_second * host


def _predicted(clock: str) -> Callable[[bd.Breakdown], float | None]:
    return lambda b: bd.speedups(b)[1].get(clock)


def metric_defs(phases: Sequence[str], positions: Sequence[str]) -> list[MetricDef]:
    """Every compared metric for runs with these phases and draft positions."""
    out = [
        MetricDef("acceptance", "acceptance rate", "acceptance", "percent",
                  lambda b: b.acceptance_rate),
        MetricDef("accept_length", "accepted drafts per drafting sequence (excl. bonus)",
                  "acceptance", "ratio", lambda b: b.mean_accept_length),
        *(MetricDef(f"position_{p}", f"acceptance at position {p}", "acceptance", "percent",
                    _position(p)) for p in positions),
        MetricDef("tokens_per_sequence_cycle", "tokens per sequence per cycle", "acceptance",
                  "ratio", _per_sequence_cycle),
    ]
    for clock in bd.CLOCKS:
        out.append(MetricDef(f"cycle_{clock}", f"cycle time ({clock} clock)", "timing",
                             "seconds", _cycle_mean(clock)))
        for phase in phases:
            out.append(MetricDef(f"phase_{phase}_{clock}", f"{phase} per cycle ({clock} clock)",
                                 "timing", "seconds", _phase_mean(phase, clock)))
    out += [
        MetricDef("batch", "mean batch size", "load", "ratio", lambda b: b.mean_batch_size),
        MetricDef("tokens_per_second", "emitted tokens/s", "throughput", "rate",
                  lambda b: b.emitted_tokens_per_second,
                  ("acceptance", "timing", "load")),
        MetricDef("cycles_per_second", "cycles/s", "throughput", "rate",
                  lambda b: b.cycles_per_second, ("timing", "load")),
        MetricDef("sequence_tokens_per_second", "tokens/s per sequence", "throughput", "rate",
                  lambda b: b.sequence_tokens_per_second, ("acceptance", "timing")),
        MetricDef("speedup_realized", "realized speedup", "throughput", "ratio",
                  lambda b: bd.speedups(b)[0], ("acceptance", "timing")),
        *(MetricDef(f"speedup_predicted_{clock}", f"predicted speedup ({clock} clock)",
                    "throughput", "ratio", _predicted(clock), ("acceptance", "timing"))
          for clock in bd.CLOCKS),
        MetricDef("drop_ratio", "dropped records per cycle", "health", "percent", _drop_ratio),
        MetricDef("overhead", "exporter overhead (GPU sampling)", "health", "percent",
                  lambda b: b.overhead_ratio),
        MetricDef("exporter_cpu", "exporter CPU per cycle", "health", "seconds",
                  lambda b: b.exporter_cpu_seconds_per_cycle),
    ]
    return out


@dataclass(frozen=True)
class Change:
    """One metric compared between runs A and B."""

    metric: MetricDef
    a: float | None
    b: float | None
    windows_a: int
    windows_b: int
    t: float | None
    df: float | None
    noise: float | None  # standard error of the difference of window means
    beyond_noise: bool
    large_enough: bool
    verdict: str  # significant | consequence | no change | too few windows | n/a
    explained_by: tuple[str, ...] = ()

    @property
    def significant(self) -> bool:
        return self.verdict in ("significant", "consequence")

    @property
    def difference(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def relative(self) -> float | None:
        return None if self.difference is None else bd.ratio(self.difference, abs(self.a or 0))


def _large_enough(m: MetricDef, a: float, b: float, min_change: float) -> bool:
    if m.kind == "percent":
        return abs(b - a) >= max(0.01, min_change * max(abs(a), abs(b)))
    if a == 0:
        return b != 0
    return abs(b - a) / abs(a) >= min_change


def compare(
    defs: Sequence[MetricDef],
    total_a: bd.Breakdown,
    total_b: bd.Breakdown,
    windows_a: Sequence[bd.Breakdown],
    windows_b: Sequence[bd.Breakdown],
    *,
    alpha: float = 0.01,
    min_change: float = 0.10,
) -> list[Change]:
    """Every metric of ``defs`` compared; see the module docstring for the rule."""
    first: list[Change] = []
    for m in defs:
        a, b = m.get(total_a), m.get(total_b)
        wa = [v for v in (m.get(w) for w in windows_a) if v is not None and math.isfinite(v)]
        wb = [v for v in (m.get(w) for w in windows_b) if v is not None and math.isfinite(v)]
        if a is None or b is None:
            first.append(Change(m, a, b, len(wa), len(wb), None, None, None, False, False,
                                "n/a"))
            continue
        if len(wa) < MIN_WINDOWS or len(wb) < MIN_WINDOWS:
            first.append(Change(m, a, b, len(wa), len(wb), None, None, None, False,
                                _large_enough(m, a, b, min_change), "too few windows"))
            continue
        t, df = welch(wa, wb)
        va = statistics.variance(wa) / len(wa)
        vb = statistics.variance(wb) / len(wb)
        beyond = abs(t) > t_critical(df, alpha)
        large = _large_enough(m, a, b, min_change)
        verdict = "significant" if beyond and large else "no change"
        first.append(Change(m, a, b, len(wa), len(wb), t, df, math.sqrt(va + vb), beyond, large,
                            verdict))
    roots = {c.metric.group for c in first
             if c.verdict == "significant" and not c.metric.explained_by}
    out: list[Change] = []
    for c in first:
        if c.verdict == "significant" and c.metric.group == "load":
            c = Change(c.metric, c.a, c.b, c.windows_a, c.windows_b, c.t, c.df, c.noise,
                       c.beyond_noise, c.large_enough, "load differs")
        if c.verdict == "significant" and c.metric.explained_by:
            because = tuple(g for g in c.metric.explained_by if g in roots)
            if because:
                c = Change(c.metric, c.a, c.b, c.windows_a, c.windows_b, c.t, c.df, c.noise,
                           c.beyond_noise, c.large_enough, "consequence", because)
        out.append(c)
    return out


def findings(changes: Sequence[Change]) -> list[Change]:
    """The headline: significant changes that are not consequences of others."""
    return [c for c in changes if c.verdict == "significant"]


#: Which way is worse for each group (``load`` is neither: it is the traffic, not the server).
_WORSE_WHEN_LOWER = ("acceptance", "throughput")
_WORSE_WHEN_HIGHER = ("timing", "health")


def regressions(changes: Sequence[Change]) -> list[Change]:
    """The headline changes that are worse in B than in A: acceptance or throughput down, a
    phase, the cycle or the exporter's cost up (``report --compare`` exits 3 on any)."""
    out = []
    for c in findings(changes):
        if c.a is None or c.b is None:
            continue
        group = c.metric.group
        if (group in _WORSE_WHEN_LOWER and c.b < c.a) or (
                group in _WORSE_WHEN_HIGHER and c.b > c.a):
            out.append(c)
    return out

