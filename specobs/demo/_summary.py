"""The live terminal summary of ``specobs demo``: numbers from two observer snapshots.

:func:`compute_view` turns the change between two :class:`specobs.Snapshot` reads (plus the
engine's request counts) into a :class:`DemoView`: mean milliseconds per cycle and share of the
cycle for each phase on the GPU and host clocks, acceptance rate, mean accept length, acceptance
by draft position, tokens/s, cycles/s, mean batch size, per-sequence speed and the realized
speedup against the non-speculative baseline, and below 1 why (the diagnosis's speedup finding:
the draft still warming up, acceptance too low for its cost, verify-bound at this batch size,
too few cycles). Every number is
:func:`specobs.tools._breakdown.breakdown`'s, the definition ``specobs top`` shows and the
recording rules compute; this module only renders it. :func:`render_rich` draws it with rich
(used inside ``rich.live.Live``); :func:`plain_line` is the one-line form for logs and pipes;
:func:`final_lines` the summary printed at exit.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from specobs.tools import _diagnosis as dg
from specobs.tools._breakdown import CLOCKS, Breakdown, breakdown, snapshot_delta, speedups

if TYPE_CHECKING:
    from specobs import Snapshot

__all__ = [
    "DemoView",
    "compute_view",
    "final_lines",
    "plain_line",
    "render_rich",
    "where_lines",
]


@dataclasses.dataclass(frozen=True)
class PhaseTime:
    """One phase on one clock: mean milliseconds per cycle and share of the cycle (0..1)."""

    ms_per_cycle: float
    share: float


class _FromBreakdown:
    """A number of the view's :class:`Breakdown`, read as an attribute of the view."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, view: DemoView, owner: type | None = None) -> float | None:
        value: float | None = getattr(view.breakdown, self.name)
        return value


@dataclasses.dataclass(frozen=True)
class DemoView:
    """One window of the demo: the :class:`Breakdown` (the numbers ``specobs top`` and the
    recording rules compute) and the run's lifetime totals shown next to it."""

    breakdown: Breakdown
    window_seconds: float
    cycles_total: int
    emitted_total: int
    dropped_total: int
    #: The run before the window (``None`` for the whole run): whether acceptance is rising.
    past: Breakdown | None = None

    @property
    def cycles_per_second(self) -> float:
        return self.breakdown.cycles_per_second or 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.breakdown.emitted_tokens_per_second or 0.0

    acceptance_rate = _FromBreakdown("acceptance_rate")

    mean_accept_length = _FromBreakdown("mean_accept_length")

    @property
    def per_position(self) -> tuple[float | None, ...]:
        """Accepted / drafted tokens at draft positions 0..k-1 (the engines' numbering: vLLM's
        per-position counters start at 0), in the order of ``position_labels``."""
        return tuple(v for _, v in self.breakdown.position_acceptance)

    @property
    def position_labels(self) -> tuple[str, ...]:
        """The draft positions of ``per_position`` as the counters label them ("0", "1", ...),
        the labels ``specobs top`` and the report show."""
        return tuple(p for p, _ in self.breakdown.position_acceptance)

    batch_size_mean = _FromBreakdown("mean_batch_size")

    sequence_tokens_per_second = _FromBreakdown("sequence_tokens_per_second")

    baseline_tokens_per_second = _FromBreakdown("baseline_tokens_per_second")

    @property
    def gpu_sampling_interval(self) -> int:
        return int(self.breakdown.sampling_interval or 1)

    @property
    def speedup(self) -> float | None:
        return speedups(self.breakdown)[0]

    @property
    def speedup_note(self) -> str:
        """Why the speedup is below 1, from the diagnosis's speedup finding (docs/diagnosis.md);
        empty at or above 1 or without a baseline."""
        value = self.speedup
        if value is None or value >= 1.0:
            return ""
        finding = dg.speedup(self.breakdown, self.past)
        if finding.code == "SPEC-SPEEDUP-WARMING":
            return "acceptance is still rising: the draft is warming up"
        if finding.code == "SPEC-SPEEDUP-UNKNOWN":
            return "too few cycles in the window to judge"
        return finding.sentence.rsplit("; ", 1)[-1]

    @property
    def phases(self) -> dict[str, dict[str, PhaseTime | None]]:
        """Mean milliseconds per cycle and share, by phase and clock (``None``: no sample)."""
        out: dict[str, dict[str, PhaseTime | None]] = {}
        for phase in self.breakdown.phases:
            out[phase] = {}
            for clock in CLOCKS:
                st = self.breakdown.stats.get((phase, clock))
                out[phase][clock] = (
                    None if st is None or st.mean_seconds is None
                    else PhaseTime(st.mean_seconds * 1000.0, st.share or 0.0)
                )
        return out

    @property
    def cycle_ms(self) -> dict[str, float | None]:
        means = self.breakdown.cycle_mean_seconds
        return {c: None if (m := means.get(c)) is None else m * 1000.0 for c in CLOCKS}


def compute_view(
    new: Snapshot, old: Snapshot | None, window_seconds: float, baseline: float | None = None
) -> DemoView:
    """The view of what happened between snapshots ``old`` and ``new`` (``old=None``: since the
    start). ``window_seconds`` is the wall time between them. ``baseline``: the non-speculative
    tokens/s per sequence when the demo measures it (else the observer's configured one)."""
    past = None if old is None else breakdown(snapshot_delta(old, None, window_seconds, baseline))
    return DemoView(
        breakdown=breakdown(snapshot_delta(new, old, window_seconds, baseline)),
        window_seconds=window_seconds,
        cycles_total=new.cycles_total,
        emitted_total=new.emitted_tokens_total,
        dropped_total=new.dropped_total(),
        past=past,
    )


def _incl(accepted: float | None) -> float | None:
    """The mean acceptance length vLLM users know (bonus token included) from the accepted
    drafts per drafting sequence."""
    return None if accepted is None else 1.0 + accepted


def _f(v: float | None, fmt: str, none: str = "-") -> str:
    return none if v is None else format(v, fmt)


def _speedup_text(view: DemoView, baseline_note: str | None = None) -> str:
    """``speedup 1.62x`` (with why, below 1), or why there is none: no baseline measured yet,
    or no cycle in the window; ``baseline_note`` (how the baseline is chosen) adds
    ``vs baseline B (note): `` in front."""
    base = view.baseline_tokens_per_second
    if base is None:
        return "no baseline yet" + (f" ({baseline_note})" if baseline_note else "")
    if view.speedup is None:
        text = "speedup - (no cycles in the window)"
    else:
        text = f"speedup {view.speedup:.2f}x" + (
            f" ({view.speedup_note})" if view.speedup_note else "")
    return text if baseline_note is None else f"vs baseline {base:.1f} ({baseline_note}): {text}"


def plain_line(view: DemoView, *, fault: str | None, requests: str = "",
               training: str = "") -> str:
    """One line: rates, acceptance and the per-phase split on each clock."""
    parts = [
        f"cycles/s {view.cycles_per_second:6.1f}",
        f"tokens/s {view.tokens_per_second:7.1f}",
        f"acceptance {_f(view.acceptance_rate, '.2f')}",
        f"acceptance length {_f(_incl(view.mean_accept_length), '.2f')}",
        f"batch {_f(view.batch_size_mean, '.1f')}",
        _speedup_text(view),
    ]
    for clock in CLOCKS:
        split = [
            f"{phase} {t.ms_per_cycle:.2f} ms ({t.share:.0%})"
            for phase, by_clock in view.phases.items()
            if (t := by_clock[clock]) is not None
        ]
        parts.append(f"{clock}: " + (", ".join(split) if split else "n/a"))
    parts.append(f"fault {fault or 'none'}")
    if training:
        parts.append(training)
    if requests:
        parts.append(requests)
    return " | ".join(parts)


def where_lines(
    metrics_url: str | None, completions_url: str, target: str | None, *, admin: bool = False
) -> list[str]:
    """Where to point Prometheus and Grafana (and, when admin endpoints are on, faults)."""
    faults = (f"   (faults: POST {completions_url}/admin/fault, with the admin token)" if admin
              else "")
    out = [f"completions  {completions_url}/v1/completions{faults}"]
    if metrics_url:
        out += [
            f"metrics      {metrics_url}",
            "Prometheus   scrape_configs:",
            "               - job_name: specobs",
            "                 scrape_interval: 5s",
            f"                 static_configs: [{{targets: ['{target}']}}]",
            "Grafana      docker compose up -d  (Prometheus, Grafana dashboards, alerts; see "
            "docs/deploy.md), or scripts/stack-local.sh without Docker",
        ]
    else:
        out.append(f"metrics      {completions_url}/metrics (no Prometheus exporter port: "
                   "SPECOBS_EXPORTERS excludes prometheus)")
    return out


def render_rich(
    view: DemoView,
    *,
    title: str,
    fault: str | None,
    requests: str,
    where: list[str],
    baseline_note: str,
    training: str = "",
) -> Any:
    """A rich renderable of the view (phase table, rates, acceptance, where to look);
    ``training``: the draft head's training in the background, a row of its own while it runs."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    phases = Table(title="cycle breakdown (last window)", expand=False, title_justify="left")
    phases.add_column("phase")
    for clock in CLOCKS:
        phases.add_column(f"{clock} ms/cycle", justify="right")
        phases.add_column(f"{clock} share", justify="right")
    for phase, by_clock in view.phases.items():
        row = [phase]
        for clock in CLOCKS:
            t = by_clock[clock]
            row += ["-", "-"] if t is None else [f"{t.ms_per_cycle:.2f}", f"{t.share:.0%}"]
        phases.add_row(*row)
    total_row = ["cycle"]
    for clock in CLOCKS:
        total_row += [_f(view.cycle_ms[clock], ".2f"), ""]
    phases.add_row(*total_row, style="bold")

    gpu_missing = all(by_clock["gpu"] is None for by_clock in view.phases.values())
    stats = Table.grid(padding=(0, 2))
    stats.add_column(style="bold")
    stats.add_column()
    speed = _f(view.sequence_tokens_per_second, ".1f")
    rows = [
        ("cycles/s", f"{view.cycles_per_second:.1f}  (total {view.cycles_total})"),
        ("tokens/s", f"{view.tokens_per_second:.1f}  (total {view.emitted_total})"),
        ("acceptance rate", _f(view.acceptance_rate, ".1%")),
        ("mean acceptance length", f"{_f(_incl(view.mean_accept_length), '.2f')} incl. bonus "
                                   f"({_f(view.mean_accept_length, '.2f')} of "
                                   f"{len(view.per_position)} drafts accepted)"),
        ("by draft position", "  ".join(f"{i}: {_f(p, '.0%')}" for i, p in
                                        zip(view.position_labels, view.per_position,
                                            strict=True))),
        ("batch size", _f(view.batch_size_mean, ".1f")),
        ("per-sequence tokens/s", f"{speed}  {_speedup_text(view, baseline_note)}"),
        *([("draft head", training)] if training else []),
        ("fault", fault or "none"),
        ("requests", requests),
        ("exporter", f"dropped {view.dropped_total}, " + (
            "no GPU clock (host only)" if gpu_missing
            else f"GPU clock on 1 cycle in {view.gpu_sampling_interval}")),
    ]
    for name, value in rows:
        stats.add_row(name, value)
    notes = []
    if gpu_missing:
        notes.append(Text("no GPU clock on this device: host clock only", style="dim"))
    return Panel(
        Group(phases, *notes, Text(""), stats, Text(""), Text("\n".join(where), style="cyan")),
        title=title,
    )


def final_lines(
    view: DemoView,
    *,
    seconds: float,
    fault: str | None,
    baseline_note: str,
    requests: str,
) -> list[str]:
    """The summary printed when the demo stops (over its whole run)."""
    out = [
        f"specobs demo ran {seconds:.1f} s: {view.cycles_total} cycles, {view.emitted_total} "
        f"tokens ({view.cycles_per_second:.1f} cycles/s, {view.tokens_per_second:.1f} tokens/s)",
        f"  acceptance rate {_f(view.acceptance_rate, '.1%')}, mean acceptance length "
        f"{_f(_incl(view.mean_accept_length), '.2f')} incl. bonus ("
        f"{_f(view.mean_accept_length, '.2f')} of {len(view.per_position)} drafts accepted), "
        "by position "
        + ", ".join(_f(p, ".0%") for p in view.per_position),
        f"  mean batch size {_f(view.batch_size_mean, '.1f')}; per-sequence "
        f"{_f(view.sequence_tokens_per_second, '.1f')} tokens/s "
        + _speedup_text(view, baseline_note),
        "  cycle breakdown (mean per cycle, share):",
    ]
    for clock in CLOCKS:
        cells = [
            f"{phase} {t.ms_per_cycle:.2f} ms ({t.share:.0%})"
            for phase, by_clock in view.phases.items()
            if (t := by_clock[clock]) is not None
        ]
        total = view.cycle_ms[clock]
        out.append(
            f"    {clock:4s}: "
            + (", ".join(cells) + f"; cycle {total:.2f} ms" if cells and total else
               "n/a (no GPU clock on this device)" if clock == "gpu" else "n/a")
        )
    out.append(f"  final fault {fault or 'none'}; requests {requests}")
    return out
